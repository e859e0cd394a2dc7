//! Reading the log in pages with the next page already on its way, so that
//! the database produces page n+1 while the caller decodes and applies page
//! n: on a small machine the two then share the cores instead of taking
//! turns.

use tokio::sync::mpsc;
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

/// What a [`DecodingReader`]'s pipeline hands back: the decoded page, the
/// position of its last event and whether the page was full.
type Decoded<T> = (Vec<T>, Option<u64>, bool);

/// Pages of [`EventText`]s, each turned into the caller's values by
/// `decode`, in a pipeline of two tasks: one reads page n+2 (on PostgreSQL
/// a COPY, taken apart as it arrives) while the other decodes page n+1 and
/// the caller applies page n. Replay uses it with large pages. Reading and
/// decoding each get their own task because on a small machine the database
/// server, the decoding and the views' work then share the cores instead of
/// taking turns: when one task both read and decoded, the server sat idle
/// while a page was decoded.
///
/// The pipeline reads ahead while pages come back full and stops at the
/// first short one (the head); the next call after that starts a new one
/// from there, so a reader can be asked again later for what was appended
/// since.
#[derive(Debug)]
pub struct DecodingReader<S, T> {
    store: S,
    after: u64,
    page: usize,
    decode: fn(EventText) -> T,
    pipe: Option<Pipe<T>>,
}

#[derive(Debug)]
struct Pipe<T> {
    pages: mpsc::Receiver<Result<Decoded<T>>>,
    tasks: [JoinHandle<()>; 2],
}

impl<T> Drop for Pipe<T> {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
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
            pipe: None,
        }
    }

    fn start(&self) -> Pipe<T> {
        let (store, mut after, page, decode) =
            (self.store.clone(), self.after, self.page, self.decode);
        // One page waiting in each channel: with the one being read, the
        // one being decoded and the one being applied, at most five pages
        // are in memory.
        let (read_tx, mut read_rx) = mpsc::channel::<Result<Vec<EventText>>>(1);
        let (decoded_tx, pages) = mpsc::channel(1);
        let reading = tokio::spawn(async move {
            loop {
                let events = store.read_all_text(after, page).await;
                let more = match &events {
                    Ok(events) => {
                        after = events.last().map_or(after, |e| e.position);
                        events.len() == page
                    }
                    Err(_) => false,
                };
                if read_tx.send(events).await.is_err() || !more {
                    return;
                }
            }
        });
        let decoding = tokio::spawn(async move {
            while let Some(events) = read_rx.recv().await {
                let decoded = events.map(|events| {
                    let last = events.last().map(|e| e.position);
                    let full = events.len() == page;
                    (events.into_iter().map(decode).collect(), last, full)
                });
                if decoded_tx.send(decoded).await.is_err() {
                    return;
                }
            }
        });
        Pipe {
            pages,
            tasks: [reading, decoding],
        }
    }

    /// The next page (empty at the head), in order.
    pub async fn next_page(&mut self) -> Result<Vec<T>> {
        if self.pipe.is_none() {
            self.pipe = Some(self.start());
        }
        let next = match &mut self.pipe {
            Some(pipe) => pipe.pages.recv().await,
            None => None,
        };
        match next {
            Some(Ok((page, last, full))) => {
                if let Some(last) = last {
                    self.after = last;
                }
                // The pipeline stops after a short page.
                if !full {
                    self.pipe = None;
                }
                Ok(page)
            }
            Some(Err(e)) => {
                self.pipe = None;
                Err(e)
            }
            None => {
                self.pipe = None;
                Err(crate::StoreError::Invalid(
                    "reader task ended without an answer".into(),
                ))
            }
        }
    }
}
