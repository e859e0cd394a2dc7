//! Reading the log in pages with the next page already on its way, so that
//! the database produces page n+1 while the caller decodes and applies page
//! n: on a small machine the two then share the cores instead of taking
//! turns.

use tokio::task::JoinHandle;

use crate::{EventStore, EventText, RecordedEvent, Result};

#[derive(Debug)]
pub struct PageReader<S> {
    store: S,
    after: u64,
    page: usize,
    next: Option<JoinHandle<Result<Vec<RecordedEvent>>>>,
}

impl<S: EventStore> PageReader<S> {
    /// Pages of up to `page` events after position `after`.
    pub fn new(store: S, after: u64, page: usize) -> Self {
        PageReader {
            store,
            after,
            page: page.max(1),
            next: None,
        }
    }

    fn fetch(&self) -> JoinHandle<Result<Vec<RecordedEvent>>> {
        let (store, after, page) = (self.store.clone(), self.after, self.page);
        tokio::spawn(async move { store.read_all(after, page).await })
    }

    /// The next page (empty at the head), upcast, in order.
    pub async fn next_page(&mut self) -> Result<Vec<RecordedEvent>> {
        let pending = match self.next.take() {
            Some(p) => p,
            None => self.fetch(),
        };
        let page = pending
            .await
            .map_err(|e| crate::StoreError::Invalid(format!("reader task: {e}")))??;
        if let Some(last) = page.last() {
            self.after = last.position;
            // A full page means there may be more: ask for it now.
            if page.len() == self.page {
                self.next = Some(self.fetch());
            }
        }
        Ok(page)
    }
}

impl<S> Drop for PageReader<S> {
    fn drop(&mut self) {
        if let Some(p) = self.next.take() {
            p.abort();
        }
    }
}

/// What a [`DecodingReader`]'s task hands back: the decoded page, the
/// position of its last event and whether the page was full.
type Decoded<T> = (Vec<T>, Option<u64>, bool);

/// Pages of [`EventText`]s, each turned into the caller's values by
/// `decode` in the task that reads it: page n+1 is read and decoded while
/// the caller applies page n. Replay uses it with large pages, so that the
/// database's round trips and the decoding of payloads overlap the views'
/// work.
#[derive(Debug)]
pub struct DecodingReader<S, T> {
    store: S,
    after: u64,
    page: usize,
    decode: fn(EventText) -> T,
    next: Option<JoinHandle<Result<Decoded<T>>>>,
}

impl<S: EventStore, T: Send + 'static> DecodingReader<S, T> {
    /// Pages of up to `page` events after position `after`, upcast, each
    /// event passed through `decode`.
    pub fn new(store: S, after: u64, page: usize, decode: fn(EventText) -> T) -> Self {
        DecodingReader {
            store,
            after,
            page: page.max(1),
            decode,
            next: None,
        }
    }

    fn fetch(&self) -> JoinHandle<Result<Decoded<T>>> {
        let (store, after, page, decode) = (self.store.clone(), self.after, self.page, self.decode);
        tokio::spawn(async move {
            let events = store.read_all_text(after, page).await?;
            let last = events.last().map(|e| e.position);
            let full = events.len() == page;
            Ok((events.into_iter().map(decode).collect(), last, full))
        })
    }

    /// The next page (empty at the head), in order.
    pub async fn next_page(&mut self) -> Result<Vec<T>> {
        let pending = match self.next.take() {
            Some(p) => p,
            None => self.fetch(),
        };
        let (page, last, full) = pending
            .await
            .map_err(|e| crate::StoreError::Invalid(format!("reader task: {e}")))??;
        if let Some(last) = last {
            self.after = last;
        }
        // A full page means there may be more: ask for it now.
        if full {
            self.next = Some(self.fetch());
        }
        Ok(page)
    }
}

impl<S, T> Drop for DecodingReader<S, T> {
    fn drop(&mut self) {
        if let Some(p) = self.next.take() {
            p.abort();
        }
    }
}
