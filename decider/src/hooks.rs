//! A seam for tests of the race between deciding and appending.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

type HookFn = dyn Fn(u32) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

/// Runs after a decision and before its append; gets the try's number,
/// from 1.
#[derive(Clone)]
pub struct BeforeAppend(pub Arc<HookFn>);

impl fmt::Debug for BeforeAppend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BeforeAppend")
    }
}
