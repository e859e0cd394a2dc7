//! Reading the log in pages with the next page already on its way, so that
//! the database produces page n+1 while the caller decodes and applies page
//! n: on a small machine the two then share the cores instead of taking
//! turns.

use tokio::task::JoinHandle;

use crate::{EventStore, RecordedEvent, Result};

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
