//! A real headless Chromium for tests, driven over W3C WebDriver.
//!
//! `Browser::start` runs a private `chromedriver` (the Debian package
//! `chromium-driver`), opens one session on Chromium (`CHROMIUM`, else
//! `/usr/bin/chromium`) and closes both when dropped. Each test gets its own
//! driver and browser, so tests run in parallel without sharing cookies.
//!
//! Waiting is always polling with a deadline (`wait_for`, `wait_text`,
//! `wait_alert`), never a fixed sleep, and every failure says what was
//! expected: which selector, which text, how long it waited.
//!
//! An alert stays open until the test accepts it: while one is open every
//! other command fails with "unexpected alert open" and the alert's text,
//! so a script that should not have run cannot go unnoticed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

/// The key under which W3C WebDriver names an element in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long chromedriver may take to report its port and become ready.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// An upper bound on any one WebDriver command, so that a hung browser fails
/// the test instead of hanging it. Above the session's page-load timeout.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// Resolves once the page has run the tasks queued before it and painted a
/// frame: what `alert_text` waits for before it says no alert opened.
const SETTLE: &str = "const done = arguments[arguments.length - 1];\
                      setTimeout(() => requestAnimationFrame(() => setTimeout(done, 0)), 0);";

/// How often the `wait_*` methods look again.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

const INSTALL_HINT: &str = "install chromium and chromium-driver (Debian packages: \
                            apt-get install chromium chromium-driver)";

/// What went wrong while driving the browser.
#[derive(Debug, thiserror::Error)]
pub enum WebDriverError {
    #[error("{what} not found at {path}: {INSTALL_HINT}")]
    NotInstalled { what: &'static str, path: String },
    #[error("cannot start chromedriver ({path}): {source}")]
    Spawn {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("chromedriver did not start within {waited:?}: {detail}")]
    Startup { waited: Duration, detail: String },
    #[error("WebDriver request {command} failed: {source}")]
    Http {
        command: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("WebDriver {command} failed: {error}: {message}")]
    Command {
        command: String,
        error: String,
        message: String,
    },
    #[error("WebDriver {command} gave an unexpected answer: {value}")]
    Protocol { command: String, value: String },
    #[error("no element matches `{css}` (waited {waited:?})")]
    NotFound { css: String, waited: Duration },
    #[error("`{css}` did not contain {needle:?} within {waited:?}; last text: {last:?}")]
    TextNotFound {
        css: String,
        needle: String,
        waited: Duration,
        last: Option<String>,
    },
    #[error("no alert opened within {waited:?}")]
    NoAlert { waited: Duration },
    #[error("screenshot is not valid base64: {0}")]
    Screenshot(#[from] base64::DecodeError),
}

impl WebDriverError {
    /// The W3C error code (`"no such element"`, `"no such alert"`, …) when the
    /// driver answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            WebDriverError::Command { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The connection to one WebDriver session; elements share it.
#[derive(Debug, Clone)]
struct Session {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`
    url: String,
}

impl Session {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WebDriverError> {
        let url = format!("{}{path}", self.url);
        send(&self.http, method, &url, body).await
    }

    async fn get(&self, path: &str) -> Result<Value, WebDriverError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, WebDriverError> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// A command whose answer carries nothing (`null`).
    async fn act(&self, path: &str, body: Value) -> Result<(), WebDriverError> {
        self.post(path, body).await.map(|_| ())
    }

    fn element(&self, value: &Value, command: &str) -> Result<Element, WebDriverError> {
        match value.get(ELEMENT_KEY).and_then(Value::as_str) {
            Some(id) => Ok(Element {
                session: self.clone(),
                id: id.to_owned(),
            }),
            None => Err(WebDriverError::Protocol {
                command: command.to_owned(),
                value: value.to_string(),
            }),
        }
    }

    async fn find(&self, css: &str) -> Result<Element, WebDriverError> {
        let found = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await;
        match found {
            Ok(v) => self.element(&v, "find element"),
            Err(e) if e.code() == Some("no such element") => Err(WebDriverError::NotFound {
                css: css.to_owned(),
                waited: Duration::ZERO,
            }),
            Err(e) => Err(e),
        }
    }
}

/// Sends one WebDriver command and unwraps its `value`, turning a W3C error
/// answer into `WebDriverError::Command`.
async fn send(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value, WebDriverError> {
    let command = format!("{method} {url}");
    let mut req = http.request(method, url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let http_err = |source| WebDriverError::Http {
        command: command.clone(),
        source,
    };
    let resp = req.send().await.map_err(http_err)?;
    let ok = resp.status().is_success();
    let mut answer: Value = resp.json().await.map_err(http_err)?;
    let value = answer
        .get_mut("value")
        .map(Value::take)
        .unwrap_or(Value::Null);
    if ok {
        return Ok(value);
    }
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    Err(WebDriverError::Command {
        command,
        error: text("error"),
        message: text("message"),
    })
}

/// A headless Chromium with its own chromedriver; both end on drop.
#[derive(Debug)]
pub struct Browser {
    session: Session,
    driver: Child,
    quit: bool,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session.
    ///
    /// The driver is `CHROMEDRIVER`, else `chromedriver` on `PATH`; the
    /// browser is `CHROMIUM`, else `/usr/bin/chromium`.
    pub async fn start() -> Result<Browser, WebDriverError> {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        if !std::path::Path::new(&chromium).exists() {
            return Err(WebDriverError::NotInstalled {
                what: "chromium",
                path: chromium,
            });
        }
        let driver_path = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        // With --port=0 chromedriver picks a port for IPv4 and then wants
        // the same one on IPv6 (or the reverse); when another process takes
        // it in between, it exits with "port not available". Another
        // start picks another port.
        let mut tries = 0;
        let (mut driver, port) = loop {
            tries += 1;
            match spawn_driver(&driver_path) {
                Err(WebDriverError::Startup { detail, .. })
                    if tries < 5 && detail.contains("port not available") => {}
                other => break other?,
            }
        };
        match open_session(port, &chromium, &mut driver).await {
            Ok(session) => Ok(Browser {
                session,
                driver,
                quit: false,
            }),
            Err(e) => {
                let _ = driver.kill();
                let _ = driver.wait();
                Err(e)
            }
        }
    }

    /// Closes the browser and the driver, reporting a failure to close.
    /// Dropping does the same but can only ignore errors.
    pub async fn quit(mut self) -> Result<(), WebDriverError> {
        self.quit = true;
        let closed = self
            .session
            .call(reqwest::Method::DELETE, "", None)
            .await
            .map(|_| ());
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        closed
    }

    /// Opens `url` and waits for it to load.
    pub async fn goto(&self, url: &str) -> Result<(), WebDriverError> {
        self.session.act("/url", json!({"url": url})).await
    }

    pub async fn back(&self) -> Result<(), WebDriverError> {
        self.session.act("/back", json!({})).await
    }

    pub async fn refresh(&self) -> Result<(), WebDriverError> {
        self.session.act("/refresh", json!({})).await
    }

    pub async fn current_url(&self) -> Result<String, WebDriverError> {
        string(self.session.get("/url").await?, "current url")
    }

    pub async fn title(&self) -> Result<String, WebDriverError> {
        string(self.session.get("/title").await?, "title")
    }

    pub async fn page_source(&self) -> Result<String, WebDriverError> {
        string(self.session.get("/source").await?, "page source")
    }

    /// The first element matching `css` now; `NotFound` when there is none.
    pub async fn find(&self, css: &str) -> Result<Element, WebDriverError> {
        self.session.find(css).await
    }

    /// Every element matching `css` now, in document order (maybe none).
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>, WebDriverError> {
        let found = self
            .session
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await?;
        let Value::Array(items) = found else {
            return Err(WebDriverError::Protocol {
                command: "find elements".into(),
                value: found.to_string(),
            });
        };
        items
            .iter()
            .map(|v| self.session.element(v, "find elements"))
            .collect()
    }

    /// The first element matching `css`, looking again until `timeout`.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> Result<Element, WebDriverError> {
        let found = poll(timeout, || async {
            match self.session.find(css).await {
                Ok(el) => Ok(Some(el)),
                Err(WebDriverError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        found.ok_or_else(|| WebDriverError::NotFound {
            css: css.to_owned(),
            waited: timeout,
        })
    }

    /// The first element matching `css` once its text contains `needle`,
    /// looking again until `timeout`. The element is found afresh each time,
    /// so a page that replaces it (or navigates) is followed.
    pub async fn wait_text(
        &self,
        css: &str,
        needle: &str,
        timeout: Duration,
    ) -> Result<Element, WebDriverError> {
        let last = std::sync::Mutex::new(None);
        let found = poll(timeout, || async {
            match self.session.find(css).await {
                Ok(el) => match el.text().await {
                    Ok(text) if text.contains(needle) => Ok(Some(el)),
                    Ok(text) => {
                        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
                        Ok(None)
                    }
                    // Replaced between finding and reading: look again.
                    Err(e) if e.code() == Some("stale element reference") => Ok(None),
                    Err(e) => Err(e),
                },
                Err(WebDriverError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        found.ok_or_else(|| WebDriverError::TextNotFound {
            css: css.to_owned(),
            needle: needle.to_owned(),
            waited: timeout,
            last: last.into_inner().unwrap_or_else(|p| p.into_inner()),
        })
    }

    /// Runs `script` as a function body with `args` (`arguments[0]`, …) and
    /// returns what it returns. Elements may be passed with `Element::to_json`.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, WebDriverError> {
        self.session
            .post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// The visible viewport as PNG bytes.
    pub async fn screenshot_png(&self) -> Result<Vec<u8>, WebDriverError> {
        let b64 = string(self.session.get("/screenshot").await?, "screenshot")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(b64)?)
    }

    /// The cookies visible to the current page, as WebDriver cookie objects
    /// (`name`, `value`, `httpOnly`, `secure`, `sameSite`, …).
    pub async fn cookies(&self) -> Result<Vec<Value>, WebDriverError> {
        match self.session.get("/cookie").await? {
            Value::Array(items) => Ok(items),
            other => Err(WebDriverError::Protocol {
                command: "get cookies".into(),
                value: other.to_string(),
            }),
        }
    }

    /// Deletes the cookies of the current page's domain.
    pub async fn delete_cookies(&self) -> Result<(), WebDriverError> {
        self.session
            .call(reqwest::Method::DELETE, "/cookie", None)
            .await
            .map(|_| ())
    }

    /// The text of the open alert, confirm or prompt; `None` when none is
    /// open even after the page has run what it had queued.
    ///
    /// A click on a `javascript:` link returns before its script runs, so a
    /// bare look right after the click misses the alert about one time in
    /// five. This first lets the page finish its queued tasks and paint a
    /// frame, so `None` is evidence that the click ran no script.
    pub async fn alert_text(&self) -> Result<Option<String>, WebDriverError> {
        if let Some(text) = self.open_alert().await? {
            return Ok(Some(text));
        }
        match self
            .session
            .post("/execute/async", json!({"script": SETTLE, "args": []}))
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some("unexpected alert open") => {}
            Err(e) => return Err(e),
        }
        self.open_alert().await
    }

    async fn open_alert(&self) -> Result<Option<String>, WebDriverError> {
        match self.session.get("/alert/text").await {
            Ok(v) => string(v, "alert text").map(Some),
            Err(e) if e.code() == Some("no such alert") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The text of the alert once one is open, looking again until `timeout`.
    pub async fn wait_alert(&self, timeout: Duration) -> Result<String, WebDriverError> {
        poll(timeout, || self.open_alert())
            .await?
            .ok_or(WebDriverError::NoAlert { waited: timeout })
    }

    /// Presses OK on the open alert.
    pub async fn accept_alert(&self) -> Result<(), WebDriverError> {
        self.session.act("/alert/accept", json!({})).await
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if self.quit {
            return;
        }
        // Deleting the session makes chromedriver close Chromium; killing the
        // driver alone could leave the browser running. Drop may run inside a
        // test's runtime, so the request runs on a thread with its own.
        let url = self.session.url.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .map_err(std::io::Error::other)?;
                send(&http, reqwest::Method::DELETE, &url, None)
                    .await
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            })
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One element of the page, as found by `Browser::find` and friends.
#[derive(Debug, Clone)]
pub struct Element {
    session: Session,
    id: String,
}

impl Element {
    fn path(&self, rest: &str) -> String {
        format!("/element/{}{rest}", self.id)
    }

    /// This element as a script argument for `Browser::execute`.
    pub fn to_json(&self) -> Value {
        json!({ ELEMENT_KEY: self.id })
    }

    pub async fn click(&self) -> Result<(), WebDriverError> {
        self.session.act(&self.path("/click"), json!({})).await
    }

    /// Types `text` into the element, after what it already holds.
    pub async fn send_keys(&self, text: &str) -> Result<(), WebDriverError> {
        self.session
            .act(&self.path("/value"), json!({"text": text}))
            .await
    }

    pub async fn clear(&self) -> Result<(), WebDriverError> {
        self.session.act(&self.path("/clear"), json!({})).await
    }

    /// The rendered text, as a user sees it.
    pub async fn text(&self) -> Result<String, WebDriverError> {
        string(self.session.get(&self.path("/text")).await?, "element text")
    }

    /// The attribute as written in the markup; `None` when absent.
    pub async fn attr(&self, name: &str) -> Result<Option<String>, WebDriverError> {
        let v = self
            .session
            .get(&self.path(&format!("/attribute/{name}")))
            .await?;
        optional_string(v, "element attribute")
    }

    /// The live DOM property (`value` of an input, `checked`, `href` resolved).
    pub async fn property(&self, name: &str) -> Result<Value, WebDriverError> {
        self.session
            .get(&self.path(&format!("/property/{name}")))
            .await
    }

    pub async fn is_displayed(&self) -> Result<bool, WebDriverError> {
        let v = self.session.get(&self.path("/displayed")).await?;
        v.as_bool().ok_or_else(|| WebDriverError::Protocol {
            command: "element displayed".into(),
            value: v.to_string(),
        })
    }
}

fn string(v: Value, command: &str) -> Result<String, WebDriverError> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(WebDriverError::Protocol {
            command: command.to_owned(),
            value: other.to_string(),
        }),
    }
}

fn optional_string(v: Value, command: &str) -> Result<Option<String>, WebDriverError> {
    match v {
        Value::Null => Ok(None),
        other => string(other, command).map(Some),
    }
}

/// Waits for the driver on `port` and opens a headless session on it.
async fn open_session(
    port: u16,
    chromium: &str,
    driver: &mut Child,
) -> Result<Session, WebDriverError> {
    let http = reqwest::Client::builder()
        .timeout(COMMAND_TIMEOUT)
        .build()
        .map_err(|source| WebDriverError::Http {
            command: "build client".into(),
            source,
        })?;
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&http, &base, driver).await?;

    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "timeouts": {"pageLoad": 30_000, "script": 30_000, "implicit": 0},
        // An alert stays open until the test handles it, so that
        // `alert_text` can report it (the default dismisses it).
        "unhandledPromptBehavior": "ignore",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1280,900",
            ],
        },
    }}});
    let url = format!("{base}/session");
    let created = send(&http, reqwest::Method::POST, &url, Some(caps)).await?;
    let Some(id) = created.get("sessionId").and_then(Value::as_str) else {
        return Err(WebDriverError::Protocol {
            command: "new session".into(),
            value: created.to_string(),
        });
    };
    Ok(Session {
        http,
        url: format!("{base}/session/{id}"),
    })
}

/// Runs chromedriver on a port the kernel picks (`--port=0`), so that
/// parallel tests never race for one, and reads the port from its
/// "started successfully on port N" line. Its output is drained afterwards
/// so that a chatty driver never blocks on a full pipe.
fn spawn_driver(path: &str) -> Result<(Child, u16), WebDriverError> {
    let mut child = Command::new(path)
        .arg("--port=0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => WebDriverError::NotInstalled {
                what: "chromedriver",
                path: path.to_owned(),
            },
            _ => WebDriverError::Spawn {
                path: path.to_owned(),
                source,
            },
        })?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(WebDriverError::Startup {
            waited: Duration::ZERO,
            detail: "no stdout to read the port from".into(),
        });
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut seen = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(sender) = &tx {
                if let Some(port) = reported_port(&line) {
                    let _ = sender.send(Ok(port));
                    tx = None;
                } else {
                    seen.push_str(&line);
                    seen.push('\n');
                }
            }
        }
        if let Some(sender) = tx {
            let _ = sender.send(Err(seen));
        }
    });
    match rx.recv_timeout(STARTUP_TIMEOUT) {
        Ok(Ok(port)) => Ok((child, port)),
        outcome => {
            let _ = child.kill();
            let _ = child.wait();
            let detail = match outcome {
                Ok(Err(seen)) => format!("it exited without reporting a port; it said: {seen}"),
                _ => "it did not report its port".into(),
            };
            Err(WebDriverError::Startup {
                waited: STARTUP_TIMEOUT,
                detail,
            })
        }
    }
}

/// The port in chromedriver's "ChromeDriver was started successfully on
/// port 33093." line.
fn reported_port(line: &str) -> Option<u16> {
    let rest = line.split("started successfully on port ").nth(1)?;
    rest.trim_end_matches('.').trim().parse().ok()
}

/// Polls `GET /status` until the driver says it is ready, failing early
/// if the driver exits.
async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    driver: &mut Child,
) -> Result<(), WebDriverError> {
    let url = format!("{base}/status");
    let last = std::sync::Mutex::new(String::new());
    let driver = std::sync::Mutex::new(driver);
    let ready = poll(STARTUP_TIMEOUT, || async {
        let said = match send(http, reqwest::Method::GET, &url, None).await {
            Ok(v) if v.get("ready").and_then(Value::as_bool) == Some(true) => return Ok(Some(())),
            Ok(v) => v.to_string(),
            Err(e) => e.to_string(),
        };
        *last.lock().unwrap_or_else(|p| p.into_inner()) = said;
        let exited = driver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_wait()
            .ok()
            .flatten();
        match exited {
            Some(status) => Err(WebDriverError::Startup {
                waited: Duration::ZERO,
                detail: format!("chromedriver exited ({status})"),
            }),
            None => Ok(None),
        }
    })
    .await?;
    ready.ok_or_else(|| WebDriverError::Startup {
        waited: STARTUP_TIMEOUT,
        detail: format!(
            "not ready: {}",
            last.into_inner().unwrap_or_else(|p| p.into_inner())
        ),
    })
}

/// Asks `attempt` every [`POLL_INTERVAL`] until it answers `Some`, fails,
/// or `timeout` passes (then `None`): the browser has no way to tell us
/// when a page has changed, so looking again is the only way to wait.
async fn poll<T, F, Fut>(timeout: Duration, mut attempt: F) -> Result<Option<T>, WebDriverError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, WebDriverError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut every = tokio::time::interval(POLL_INTERVAL);
    loop {
        every.tick().await;
        if let Some(v) = attempt().await? {
            return Ok(Some(v));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_the_startup_line() {
        assert_eq!(
            reported_port("ChromeDriver was started successfully on port 33093."),
            Some(33093)
        );
        assert_eq!(
            reported_port("Starting ChromeDriver 156.0 (abc) on port 0"),
            None
        );
    }

    #[test]
    fn a_missing_driver_says_how_to_install_it() {
        let err = spawn_driver("/nonexistent/chromedriver").expect_err("no driver there");
        assert!(
            matches!(
                err,
                WebDriverError::NotInstalled {
                    what: "chromedriver",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("install chromium and chromium-driver (Debian packages"),
            "{err}"
        );
    }
}
