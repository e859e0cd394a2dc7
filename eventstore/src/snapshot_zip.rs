//! A snapshot's state is stored zlib-compressed.
//!
//! The views of a fleet of 10,000 nodes are ~9 MiB of JSON, and binding
//! that text to a statement copied it whole, twice on SQLite (the bound
//! value, then the row being built): ~27 MiB held at once, every few
//! minutes, on top of the server's steady memory. JSON of many alike
//! records compresses ~18 times at zlib's fastest level, so the copies
//! become ~0.5 MiB each. Compressing ~9 MiB takes tens of milliseconds,
//! so it runs on the blocking pool, never on a task's thread.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;

use crate::{Result, StoreError};

/// `text` compressed, for the `state` column.
pub(crate) async fn pack(text: String) -> Result<Vec<u8>> {
    blocking(move || {
        let mut z = ZlibEncoder::new(Vec::with_capacity(text.len() / 16), Compression::fast());
        z.write_all(text.as_bytes())?;
        z.finish()
    })
    .await
}

/// The text `pack` was given; None, with a warning, for bytes that are not
/// such a text: a snapshot is a cache, and one lost is rebuilt from the log.
pub(crate) async fn unpack(name: &str, bytes: Vec<u8>) -> Result<Option<String>> {
    let unpacked = blocking(move || {
        // Sized for the usual ratio, so that a fleet's ~9 MiB is not
        // grown by doubling (old and new buffers alive at each step).
        let mut text = String::with_capacity(bytes.len().saturating_mul(20));
        ZlibDecoder::new(bytes.as_slice()).read_to_string(&mut text)?;
        Ok(text)
    })
    .await;
    match unpacked {
        Ok(text) => Ok(Some(text)),
        Err(StoreError::Invalid(why)) => {
            tracing::warn!(snapshot = name, reason = %why, "a snapshot is unreadable; ignored");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Invalid(format!("a snapshot's compression task: {e}")))?
        .map_err(|e| StoreError::Invalid(format!("a snapshot's compressed state: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn state_comes_back_as_it_went_in_and_smaller() {
        let text = r#"{"nodes":{"#.to_owned()
            + &(0..1000)
                .map(|i| format!(r#""node-{i:05}":{{"gpus":8,"class":"h100-80g"}}"#))
                .collect::<Vec<_>>()
                .join(",")
            + "}}";
        let packed = pack(text.clone()).await.unwrap();
        assert!(
            packed.len() * 5 < text.len(),
            "{} of {}",
            packed.len(),
            text.len()
        );
        assert_eq!(unpack("views", packed).await.unwrap(), Some(text));
    }

    #[tokio::test]
    async fn bytes_that_are_not_a_packed_state_are_no_snapshot() {
        let plain = b"{\"plain\": \"json\"}".to_vec();
        assert_eq!(unpack("views", plain).await.unwrap(), None);
    }
}
