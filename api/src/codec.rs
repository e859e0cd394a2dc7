//! The protobuf codec the generated services use: tonic's prost codec with
//! small buffers.
//!
//! Tonic allocates its buffer size eagerly for every RPC, once to decode
//! and once to encode, and keeps both for the stream's life; the default is
//! 8 KiB each. An agent's stream lives for as long as the agent, and its
//! messages are a few hundred bytes (a registration a few KiB), so on a
//! server holding 10,000 streams the defaults were ~160 MiB of buffers that
//! stayed empty. A buffer still grows to fit a larger message, and keeps
//! what it grew to: the decode buffer's reserve at least doubles, so the
//! step sets its resting size too (10,000 streams: 1 KiB gave 19 MiB of
//! decode and 10 MiB of encode buffers, 256 B 11 and 2.4).

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The initial size of a stream's encode and decode buffers, and the step
/// they grow by.
pub const BUFFER: usize = 256;
/// Tonic's default: how much an encoder writes before it yields.
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER, YIELD_THRESHOLD)
}

/// [`ProstCodec`] with [`BUFFER`]-sized buffers.
#[derive(Debug, Clone)]
pub struct SmallBuffers<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBuffers<T, U> {
    fn default() -> Self {
        SmallBuffers(PhantomData)
    }
}

impl<T, U> Codec for SmallBuffers<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
