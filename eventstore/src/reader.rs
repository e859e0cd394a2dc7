//! Reading the log in pages with the next page already on its way, so that
//! the database produces page n+1 while the caller decodes and applies page
//! n: on a small machine the two then share the cores instead of taking
//! turns.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::{EventRef, EventStore, RecordedEvent, Result, TextPage};

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

/// [`TextPage`]s, each event turned into the caller's values by `decode`
/// straight from the page's text, in a pipeline of two tasks: one reads
/// page n+2 (on PostgreSQL a COPY, taken apart as it arrives) while the
/// other decodes page n+1 and the caller applies page n. Replay uses it
/// with large pages. Reading and
/// decoding each get their own task because on a small machine the database
/// server, the decoding and the views' work then share the cores instead of
/// taking turns: when one task both read and decoded, the server sat idle
/// while a page was decoded.
///
/// Memory is reused, not allocated per page: a decoded text page goes back
/// to the reading task to be filled again, and a page the caller hands back
/// with [`DecodingReader::recycle`] goes to the decoding task, which drops
/// its values there (off the caller's task) and fills it again.
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
    decode: fn(EventRef<'_>) -> T,
    pipe: Option<Pipe<T>>,
}

#[derive(Debug)]
struct Pipe<T> {
    pages: mpsc::Receiver<Result<Decoded<T>>>,
    /// Pages the caller is done with, to the decoding task.
    spent: mpsc::Sender<Vec<T>>,
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
    pub fn new(store: S, after: u64, page: usize, decode: fn(EventRef<'_>) -> T) -> Self {
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
        // are in memory, and as many spent ones waiting to be reused.
        let (read_tx, mut read_rx) = mpsc::channel::<Result<TextPage>>(1);
        let (decoded_tx, pages) = mpsc::channel(1);
        let (text_back_tx, mut text_back) = mpsc::channel::<TextPage>(2);
        let (spent, mut spent_rx) = mpsc::channel::<Vec<T>>(2);
        let reading = tokio::spawn(async move {
            loop {
                let reuse = text_back.try_recv().unwrap_or_default();
                let events = store.read_text_page(after, page, reuse).await;
                let more = match &events {
                    Ok(events) => {
                        after = events.last_position().unwrap_or(after);
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
                    let last = events.last_position();
                    let full = events.len() == page;
                    // The values of the spent page are dropped here.
                    let mut out = spent_rx.try_recv().unwrap_or_default();
                    out.clear();
                    out.extend(events.iter().map(decode));
                    // Full or closed: the page is dropped instead.
                    let _ = text_back_tx.try_send(events);
                    (out, last, full)
                });
                if decoded_tx.send(decoded).await.is_err() {
                    return;
                }
            }
        });
        Pipe {
            pages,
            spent,
            tasks: [reading, decoding],
        }
    }

    /// Hands back a page the caller has applied: the decoding task drops its
    /// values and fills its memory again. Optional; a page not handed back
    /// is dropped where it is.
    pub fn recycle(&mut self, page: Vec<T>) {
        if let Some(pipe) = &self.pipe {
            // Full or closed: the page is dropped here instead.
            let _ = pipe.spent.try_send(page);
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
