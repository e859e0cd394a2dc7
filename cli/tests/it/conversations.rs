//! Threads and memory notes through the shipped binary (issue 16): real
//! servers on SQLite and PostgreSQL, keys on, the switches thrown with
//! `llmgw keys`, and plain HTTP clients. The sim engine reports its prompt
//! tokens as ceil(bytes / 4) of "role: content\n" per message, so a test
//! can tell exactly which history a model was sent.

use std::process::Command;

use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
use llmgw_testkit::{Backend, Scratch};
use serde_json::{Value, json};

use super::tenancy::{Mode, config, engine, keys, keys_ok, leads, start, tree};
use super::until;

/// The sim engine's prompt tokens for these (role, content) lines.
fn sim_tokens(lines: &[(&str, &str)]) -> u64 {
    let bytes: usize = lines.iter().map(|(r, c)| r.len() + 2 + c.len() + 1).sum();
    bytes.div_ceil(4) as u64
}

fn key_for(store: &str, admin: &str, project: &str) -> String {
    let out = keys_ok(
        store,
        admin,
        &[
            "create",
            "--project",
            project,
            "--name",
            &format!("{project}-agent"),
        ],
    );
    out.trim().to_owned()
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn chat(&self, key: &str, thread: &str, body: Value) -> reqwest::Response {
        self.post_on("/v1/chat/completions", key, thread, body)
            .await
    }

    /// A Responses API turn on `thread`.
    async fn respond(&self, key: &str, thread: &str, body: Value) -> reqwest::Response {
        self.post_on("/v1/responses", key, thread, body).await
    }

    async fn post_on(&self, path: &str, key: &str, thread: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("x-llmgw-thread", thread)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A whole Responses turn: its text and the input tokens the engine
    /// counted.
    async fn responded(&self, key: &str, thread: &str, body: Value) -> (String, u64) {
        let r = self.respond(key, thread, body).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        (
            v["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned(),
            v["usage"]["input_tokens"].as_u64().unwrap(),
        )
    }

    /// A whole (not streamed) turn: the reply's text and the prompt tokens
    /// the engine counted, and how many turns were trimmed.
    async fn turn(
        &self,
        key: &str,
        thread: &str,
        model: &str,
        messages: Value,
    ) -> (String, u64, String) {
        let r = self
            .chat(
                key,
                thread,
                json!({"model": model, "max_tokens": 4, "messages": messages}),
            )
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let trimmed = r.headers()["x-llmgw-thread-trimmed"]
            .to_str()
            .unwrap()
            .to_owned();
        let v: Value = r.json().await.unwrap();
        (
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned(),
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            trimmed,
        )
    }

    async fn memory(
        &self,
        key: &str,
        agent: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self
            .http
            .request(method, format!("{}/v1/memory{path}", self.base))
            .bearer_auth(key);
        if let Some(a) = agent {
            r = r.header("x-llmgw-agent", a);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// The server's store, opened beside it to read or write its
/// conversation tables directly.
async fn open_log(store: &str) -> AnyStore {
    AnyStore::open(&StoreAddress::parse(store).unwrap(), OpenOptions::default())
        .await
        .unwrap()
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

type Setup = (
    String,
    Scratch,
    super::Child,
    super::tenancy::Server,
    String,
    String,
);

/// Starts a router-only server with keys on, two projects and their keys.
async fn setup(backend: Backend, dir: &std::path::Path) -> Setup {
    setup_sweeping(backend, dir, "100ms").await
}

/// The same, sweeping every `sweep` (the first at the start).
async fn setup_sweeping(backend: Backend, dir: &std::path::Path, sweep: &str) -> Setup {
    let (store, scratch) = Scratch::new(backend).await;
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = format!(
        "auth: {{enabled: true, flush_interval: 50ms}}\n\
         conversations: {{default_context: 220, sweep_interval: {sweep}}}\n"
    );
    let server = start(&config(dir, "convo", &store, &e, Mode::RouterOnly, &extra));
    for p in ["p", "q"] {
        keys_ok(
            &store,
            &server.admin,
            &["init", "--org", "o", "--team", "t", "--project", p],
        );
    }
    let kp = key_for(&store, &server.admin, "p");
    let kq = key_for(&store, &server.admin, "q");
    (store, scratch, engine, server, kp, kq)
}

async fn threads_story(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, kq) = setup(backend, dir.path()).await;
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let hello = json!([{"role": "user", "content": "hello"}]);

    // Off by default: refused with how to turn it on, never served bare.
    let r = c
        .chat(&kp, "t1", json!({"model": "paid", "messages": hello}))
        .await;
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert!(
        message(&v).contains("llmgw keys threads --project p"),
        "{v}"
    );

    let said = keys_ok(
        &store,
        &server.admin,
        &["threads", "--project", "p", "--capture"],
    );
    assert!(said.contains("project p keeps threads for 168 h"), "{said}");
    keys_ok(&store, &server.admin, &["threads", "--project", "q"]);

    // Turn 1 on `paid`: a system message and the first question.
    let sys = ("system", "be brief");
    let u1 = "1".repeat(300);
    let (a1, tokens, trimmed) = c
        .turn(
            &kp,
            "t1",
            "paid",
            json!([{"role": "system", "content": sys.1}, {"role": "user", "content": u1}]),
        )
        .await;
    assert_eq!(
        (tokens, trimmed.as_str()),
        (sim_tokens(&[sys, ("user", &u1)]), "0")
    );

    // Turn 2 on another model, streamed: the client sends only its turn.
    let u2 = "2".repeat(300);
    let r = c
        .chat(
            &kp,
            "t1",
            json!({"model": "free", "max_tokens": 4, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": u2}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let mut a2 = String::new();
    let mut tokens = 0;
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            a2.push_str(t);
        }
        if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
            tokens = n;
        }
    }
    assert_eq!(
        tokens,
        sim_tokens(&[sys, ("user", &u1), ("assistant", &a1), ("user", &u2)]),
        "the second model got the whole history, the first model's reply included"
    );

    // Turn 3 no longer fits 220 tokens: the oldest turn goes whole (its
    // question and its reply: a reply left without its question is
    // refused by chat templates), the system message and the new turn
    // stay. The engine counted (the sim answers vLLM's /tokenize): turn
    // 2, 165 tokens, was sent whole, where the gateway's estimate (three
    // bytes a token of the JSON) would have trimmed it.
    let u3 = "3".repeat(300);
    let (_, tokens, trimmed) = c
        .turn(&kp, "t1", "paid", json!([{"role": "user", "content": u3}]))
        .await;
    assert_eq!(trimmed, "2");
    assert_eq!(
        tokens,
        sim_tokens(&[sys, ("user", &u2), ("assistant", &a2), ("user", &u3)])
    );

    // Project q's thread of the same id is its own (and q keeps no replies).
    let (_, tokens, _) = c.turn(&kq, "t1", "free", hello.clone()).await;
    assert_eq!(tokens, sim_tokens(&[("user", "hello")]));
    let (_, tokens, _) = c.turn(&kq, "t1", "free", hello.clone()).await;
    assert_eq!(tokens, sim_tokens(&[("user", "hello"), ("user", "hello")]));

    // Read back: what p keeps of t1, oldest first, its replies included
    // (q's t1 is q's own); a thread p does not have is 404.
    let read = |key: &str, id: &str| {
        c.http
            .get(format!("{}/v1/threads/{id}", c.base))
            .bearer_auth(key)
            .send()
    };
    let kept: Value = read(&kp, "t1").await.unwrap().json().await.unwrap();
    let contents: Vec<&str> = kept["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(kept["id"], "t1");
    assert_eq!(contents[..2], [sys.1, u1.as_str()], "{kept}");
    assert!(
        contents.contains(&a2.as_str()) && contents.contains(&u3.as_str()),
        "{kept}"
    );
    assert_eq!(read(&kp, "nope").await.unwrap().status(), 404);

    // Deleting: another project's id answers like a missing one.
    let delete = |key: &str, id: &str| {
        c.http
            .delete(format!("{}/v1/threads/{id}", c.base))
            .bearer_auth(key)
            .send()
    };
    assert_eq!(delete(&kp, "nope").await.unwrap().status(), 404);
    assert_eq!(delete(&kp, "t1").await.unwrap().status(), 204);
    assert_eq!(delete(&kp, "t1").await.unwrap().status(), 404);
    let (_, tokens, _) = c.turn(&kp, "t1", "paid", hello.clone()).await;
    assert_eq!(
        tokens,
        sim_tokens(&[("user", "hello")]),
        "a deleted thread starts afresh"
    );
    let (_, tokens, _) = c.turn(&kq, "t1", "free", hello.clone()).await;
    assert_eq!(
        tokens,
        sim_tokens(&[("user", "hello"); 3]),
        "q's thread is untouched"
    );

    // The Responses API keeps its turns in a thread too: its input is the
    // new turn, and its reply (kept as the chat reply is) is history the
    // next turn, on either API, is sent.
    let r = c
        .respond(
            &kp,
            "r1",
            json!({"model": "paid", "input": "hello", "max_output_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-llmgw-thread-trimmed"], "0");
    let v: Value = r.json().await.unwrap();
    let reply = v["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, tokens, _) = c.turn(&kp, "r1", "paid", hello.clone()).await;
    assert_eq!(
        tokens,
        sim_tokens(&[("user", "hello"), ("assistant", &reply), ("user", "hello")])
    );

    // Instructions sent every turn are sent once, first; new ones take the
    // old ones' place (templates take one system message, first).
    let instructed = |instructions: &'static str, input: &'static str| {
        let body = json!({"model": "paid", "instructions": instructions, "input": input,
            "max_output_tokens": 2});
        c.responded(&kp, "r2", body)
    };
    let (said, _) = instructed("be brief", "one").await;
    let (reply, tokens) = instructed("be brief", "two").await;
    assert_eq!(
        tokens,
        sim_tokens(&[
            ("system", "be brief"),
            ("user", "one"),
            ("assistant", &said),
            ("user", "two")
        ])
    );
    let (_, tokens) = instructed("be kind", "three").await;
    assert_eq!(
        tokens,
        sim_tokens(&[
            ("system", "be kind"),
            ("user", "one"),
            ("assistant", &said),
            ("user", "two"),
            ("assistant", &reply),
            ("user", "three")
        ])
    );

    // A reply that called a tool is kept with its call: the next turn's
    // output answers it (a tool message with no call before it is refused
    // by the engines).
    let tools = json!([{"type": "function", "name": "weather", "parameters": {"type": "object"}}]);
    let respond = |input: Value| {
        let body = json!({"model": "paid", "input": input, "tools": tools, "stream": true});
        c.respond(&kp, "tools-1", body)
    };
    let text = respond(json!("weather?")).await.text().await.unwrap();
    let call = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "response.output_item.done")
        .expect("an item")["item"]
        .clone();
    assert_eq!(call["type"], "function_call", "{text}");
    let output =
        json!([{"type": "function_call_output", "call_id": call["call_id"], "output": "rain"}]);
    // Kept once the answer has been read whole.
    let r = respond(output).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("response.completed"));
    let kept: Value = c
        .http
        .get(format!("{}/v1/threads/tools-1", c.base))
        .bearer_auth(&kp)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let messages = kept["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["tool_calls"][0]["id"], call["call_id"],
        "{kept}"
    );
    assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "weather");
    assert_eq!(
        (&messages[2]["role"], &messages[2]["tool_call_id"]),
        (&json!("tool"), &call["call_id"]),
        "{kept}"
    );

    // Switched off: refused again, and the next sweep deletes p's threads.
    keys_ok(
        &store,
        &server.admin,
        &["threads", "--project", "p", "--off"],
    );
    let r = c
        .chat(&kp, "t1", json!({"model": "paid", "messages": hello}))
        .await;
    assert_eq!(r.status(), 403);
    let log = open_log(&store).await;
    let tables = llmgw_convo::Convo::new(&log);
    until("the sweep to delete project p's threads", || async {
        tables
            .history("p", "t1")
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(tables.history("q", "t1").await.unwrap().len(), 3);

    // The log holds the switches and who threw them, never the text.
    let events = super::ok(
        &store,
        &["events", "tail", "--json", "--from", "1", "--limit", "1000"],
    );
    assert!(
        events.contains("ThreadsSet") && events.contains("alice"),
        "{events}"
    );
    assert!(!events.contains(&u1), "conversation text is not in the log");
}

async fn memory_story(backend: Backend) {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, kq) = setup(backend, dir.path()).await;
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let note = |text: &str, tags: &[&str]| Some(json!({"text": text, "tags": tags}));

    let (status, v) = c
        .memory(&kp, None, Method::PUT, "/plan", note("x", &[]))
        .await;
    assert_eq!(status, 403);
    assert!(
        message(&v).contains("llmgw keys memory --project p --retain-hours"),
        "{v}"
    );
    let out = keys(&store, &server.admin, &["memory", "--project", "p"]);
    assert!(!out.status.success(), "a retention is mandatory");
    keys_ok(
        &store,
        &server.admin,
        &["memory", "--project", "p", "--retain-hours", "24"],
    );
    keys_ok(
        &store,
        &server.admin,
        &["memory", "--project", "q", "--retain-hours", "24"],
    );

    let (status, v) = c
        .memory(
            &kp,
            None,
            Method::PUT,
            "/deploy-plan",
            note("Roll the GPU nodes one rack at a time", &["ops"]),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["tags"], json!(["ops"]));
    let (status, _) = c
        .memory(
            &kp,
            None,
            Method::PUT,
            "/lunch",
            note("Curry on Thursdays", &["food"]),
        )
        .await;
    assert_eq!(status, 201);
    let (status, v) = c
        .memory(
            &kp,
            None,
            Method::PUT,
            "/lunch",
            note("Curry on Fridays now", &["food"]),
        )
        .await;
    assert_eq!(
        (status, v["text"].as_str()),
        (200, Some("Curry on Fridays now"))
    );

    let keys_of = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, v) = c.memory(&kp, None, Method::GET, "?q=gpu+NODES", None).await;
    assert_eq!(keys_of(&v), ["deploy-plan"]);
    let (_, v) = c.memory(&kp, None, Method::GET, "?q=thursdays", None).await;
    assert_eq!(
        keys_of(&v),
        [] as [&str; 0],
        "the replaced text is not found"
    );
    let (_, v) = c.memory(&kp, None, Method::GET, "?tag=food", None).await;
    assert_eq!(keys_of(&v), ["lunch"]);
    let (status, v) = c.memory(&kp, None, Method::GET, "/deploy-plan", None).await;
    assert_eq!(
        (status, v["text"].as_str()),
        (200, Some("Roll the GPU nodes one rack at a time"))
    );

    // Scope: another agent, or another project, sees nothing, exactly as
    // for a key that does not exist.
    let (missing_status, missing) = c
        .memory(&kp, None, Method::GET, "/no-such-note", None)
        .await;
    assert_eq!(missing_status, 404);
    for (key, agent) in [(&kp, Some("planner")), (&kq, None)] {
        let (status, v) = c
            .memory(key, agent, Method::GET, "/deploy-plan", None)
            .await;
        assert_eq!(status, 404);
        assert_eq!(
            message(&v).replace("deploy-plan", "no-such-note"),
            message(&missing)
        );
        let (_, v) = c.memory(key, agent, Method::GET, "?q=gpu", None).await;
        assert_eq!(keys_of(&v), [] as [&str; 0]);
        let (status, _) = c
            .memory(key, agent, Method::DELETE, "/deploy-plan", None)
            .await;
        assert_eq!(status, 404);
    }
    let (status, _) = c
        .memory(
            &kp,
            Some("planner"),
            Method::PUT,
            "/deploy-plan",
            note("mine", &[]),
        )
        .await;
    assert_eq!(status, 201, "the same key is another agent's own note");

    // Every limit has its own refusal.
    let long_key = format!("/{}", "k".repeat(201));
    let too_many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let big = "x".repeat(16 * 1024 + 1);
    for (path, body, says) in [
        (long_key.as_str(), note("x", &[]), "at most 200 bytes"),
        ("/big", note(&big, &[]), "at most 16 KiB"),
        ("/tags", note("x", &too_many), "at most 16 tags"),
        ("/tag", note("x", &["Ops"]), "a-z, 0-9, _ and -"),
        // PostgreSQL holds no NUL: refused on both, not "try again".
        ("/nul", note("a\u{0}b", &[]), "no NUL"),
        // `tag` for `tags` kept a note without them.
        (
            "/typo",
            Some(json!({"text": "x", "tag": ["ops"]})),
            "unknown field `tag`",
        ),
        // axum's own refusal was plain text, not the API's envelope.
        ("/a%FFb", note("x", &[]), "the address"),
    ] {
        let (status, v) = c.memory(&kp, None, Method::PUT, path, body).await;
        assert_eq!(status, 400, "{path}: {v}");
        assert!(message(&v).contains(says), "{path}: {v}");
    }
    // A search's limit is refused out of range, as MCP's recall refuses it
    // (0 and 500 were read as 1 and 100), in the envelope.
    for limit in ["0", "500", "-1", "abc"] {
        let (status, v) = c
            .memory(&kp, None, Method::GET, &format!("?q=x&limit={limit}"), None)
            .await;
        assert_eq!(status, 400, "{limit}: {v}");
        assert!(
            message(&v).contains("limit is a whole number from 1 to 100"),
            "{limit}: {v}"
        );
    }
    let (status, v) = c
        .memory(&kp, Some("bad agent!"), Method::GET, "/x", None)
        .await;
    assert_eq!(status, 400);
    assert!(message(&v).contains("agent"), "{v}");
    for i in 0..998 {
        let (status, _) = c
            .memory(&kp, None, Method::PUT, &format!("/n{i}"), note("x", &[]))
            .await;
        assert_eq!(status, 201);
    }
    let (status, v) = c
        .memory(&kp, None, Method::PUT, "/n-more", note("x", &[]))
        .await;
    assert_eq!(status, 409);
    assert!(message(&v).contains("1000 notes"), "{v}");

    let (status, _) = c.memory(&kp, None, Method::DELETE, "/lunch", None).await;
    assert_eq!(status, 204);
    let (status, _) = c.memory(&kp, None, Method::GET, "/lunch", None).await;
    assert_eq!(status, 404);

    // Switched off: writes refused, and the sweep deletes what is left.
    keys_ok(
        &store,
        &server.admin,
        &["memory", "--project", "p", "--off"],
    );
    let (status, _) = c
        .memory(&kp, None, Method::PUT, "/late", note("x", &[]))
        .await;
    assert_eq!(status, 403);
    let log = open_log(&store).await;
    let tables = llmgw_convo::Convo::new(&log);
    let owner = llmgw_convo::Owner {
        project: "p".into(),
        agent: "default".into(),
    };
    until("the sweep to delete project p's notes", || async {
        tables
            .note(&owner, "deploy-plan")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

macro_rules! on_both {
    ($($name:ident: $body:expr;)*) => {
        $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { $body.await } )*
    };
}

on_both! {
    threads_on_sqlite: threads_story(Backend::Sqlite);
    threads_on_postgres: threads_story(Backend::Postgres);
    memory_on_sqlite: memory_story(Backend::Sqlite);
    memory_on_postgres: memory_story(Backend::Postgres);
    mcp_on_sqlite: mcp_story(Backend::Sqlite);
    mcp_on_postgres: mcp_story(Backend::Postgres);
}

/// The notes as MCP tools, driven by the official MCP Python SDK
/// (`scripts/test` installs it): the same notes as /v1/memory, the key
/// checked before anything is read, and no event stream offered.
async fn mcp_story(backend: Backend) {
    use reqwest::Method;
    let probe = Command::new("python3").args(["-c", "import mcp"]).output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "the MCP Python SDK is needed: python3 -m pip install mcp==1.30.0 (scripts/test does this)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, kq) = setup(backend, dir.path()).await;
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}});
    let r = c
        .http
        .post(format!("{}/mcp", c.base))
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no key, no MCP");
    // The key is checked before the body is read: without one, a body that
    // never ends is refused at once (none is held for a stranger), on the
    // MCP endpoint and on a note's write.
    for (method, path) in [(Method::POST, "/mcp"), (Method::PUT, "/v1/memory/x")] {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        tx.send(Ok(b"{\"text\": \"".to_vec())).await.unwrap();
        let endless = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        // A client of its own: the server closes a connection whose body it
        // did not read, and the next request must not be sent on it.
        let sent = reqwest::Client::new()
            .request(method, format!("{}{path}", c.base))
            .header("content-type", "application/json")
            .body(endless)
            .send();
        let answered = tokio::time::timeout(std::time::Duration::from_secs(10), sent)
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer while the body was still coming"));
        // The 401, or the connection closed under the body still being
        // sent once the 401 was written (the client may see either).
        match answered {
            Ok(r) => assert_eq!(r.status(), 401, "{path}"),
            Err(e) => assert!(e.is_request(), "{path}: {e}"),
        }
        drop(tx);
    }
    let r = c
        .http
        .get(format!("{}/mcp", c.base))
        .bearer_auth(&kp)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405, "no server-sent event stream");
    let r = c
        .http
        .post(format!("{}/mcp", c.base))
        .bearer_auth(&kp)
        .header("origin", "http://evil.example")
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a foreign origin is refused");
    // A page on a name rebound to this address names itself as host and
    // origin alike: refused all the same (it was let through).
    let host = c.base.trim_start_matches("http://");
    let r = c
        .http
        .post(format!("{}/mcp", c.base))
        .bearer_auth(&kp)
        .header("origin", format!("http://{host}"))
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        403,
        "an origin no cors_origins names is refused"
    );

    keys_ok(
        &store,
        &server.admin,
        &["memory", "--project", "p", "--retain-hours", "24"],
    );
    let (status, _) = c
        .memory(
            &kp,
            None,
            Method::PUT,
            "/from-rest",
            Some(json!({"text": "Written through the REST API"})),
        )
        .await;
    assert_eq!(status, 201);

    super::sdk_script("mcp_client.py", vec![c.base.clone(), kp.clone()]).await;

    let (status, v) = c.memory(&kp, None, Method::GET, "/from-mcp", None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["text"], "Written through MCP");
    assert_eq!(v["tags"], json!(["mcp"]));
    let (status, _) = c.memory(&kp, None, Method::GET, "/rack-plan", None).await;
    assert_eq!(status, 404, "forgotten through MCP");

    // A project without notes: the tool says so, as a result the model reads.
    let v: Value = c
        .http
        .post(format!("{}/mcp", c.base))
        .bearer_auth(&kq)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "remember", "arguments": {"key": "k", "text": "x"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["id"], 7);
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("llmgw keys memory --project q"),
        "{v}"
    );
}

/// Without keys: no conversations unless a `threads:` block makes one
/// shared pool; the block is refused at start when keys are on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_one_shared_pool_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let store = dir.path().join("open.db").display().to_string();
    let hello = json!([{"role": "user", "content": "hello"}]);
    let ask = |base: String| {
        let hello = hello.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .header("x-llmgw-thread", "shared")
                .json(&json!({"model": "paid", "max_tokens": 4, "messages": hello}))
                .send()
                .await
                .unwrap()
        }
    };

    let bare = start(&config(
        dir.path(),
        "bare",
        &store,
        &e,
        Mode::RouterOnly,
        "",
    ));
    let r = ask(bare.base.clone()).await;
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(message(&v), "this gateway keeps no conversations");
    drop(bare);

    let pool = start(&config(
        dir.path(),
        "pool",
        &store,
        &e,
        Mode::RouterOnly,
        "threads: {retain_hours: 2, capture: true}\n",
    ));
    let r = ask(pool.base.clone()).await;
    assert_eq!(r.status(), 200);
    let a1 = r.json::<Value>().await.unwrap()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = ask(pool.base.clone()).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        sim_tokens(&[("user", "hello"), ("assistant", &a1), ("user", "hello")])
    );

    let path = config(
        dir.path(),
        "both",
        &store,
        &e,
        Mode::RouterOnly,
        "auth: true\nthreads: {retain_hours: 2}\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_llmgw"))
        .args(["server", "--config", &path])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("llmgw keys threads --project P"), "{err}");
}

/// With the control plane: the switch goes through the leader, and the
/// catalog's context_length (not the configured default) bounds a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_control_plane_the_catalog_context_bounds_a_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let text = format!(
        r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
agent_listen: "127.0.0.1:0"
store: "{store}"
endpoints: ["e1=http://{e}=paid"]
auth: {{enabled: true, flush_interval: 50ms}}
conversations: {{default_context: 100000}}
control:
  instance: cp-convo
  interval: 200ms
models:
  - name: paid
    context_length: 220
    scaling: {{min: 0, max: 1}}
    profiles: [{{name: sim, engine: sim}}]
"#
    );
    let path = dir.path().join("cp.yaml");
    std::fs::write(&path, text).unwrap();
    let server = start(&path.display().to_string());
    leads(&server.admin).await;
    tree(&store, &server.admin);
    let kp = key_for(&store, &server.admin, "p");
    keys_ok(
        &store,
        &server.admin,
        &[
            "threads",
            "--project",
            "p",
            "--capture",
            "--retain-hours",
            "1",
        ],
    );
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let sys = ("system", "be brief");
    let (u1, u2, u3) = ("1".repeat(300), "2".repeat(300), "3".repeat(300));
    let _ = c
        .turn(
            &kp,
            "t",
            "paid",
            json!([{"role": "system", "content": sys.1}, {"role": "user", "content": u1}]),
        )
        .await;
    let (a2, _, trimmed) = c
        .turn(&kp, "t", "paid", json!([{"role": "user", "content": u2}]))
        .await;
    assert_eq!(trimmed, "0");
    let (_, tokens, trimmed) = c
        .turn(&kp, "t", "paid", json!([{"role": "user", "content": u3}]))
        .await;
    assert_eq!(
        trimmed, "2",
        "220 tokens from the catalog, not the default's 100000"
    );
    assert_eq!(
        tokens,
        sim_tokens(&[sys, ("user", &u2), ("assistant", &a2), ("user", &u3)])
    );
    let events = super::ok(
        &store,
        &["events", "tail", "--json", "--from", "1", "--limit", "1000"],
    );
    let switch = events
        .lines()
        .find(|l| l.contains("ThreadsSet"))
        .expect("the switch is in the log");
    assert!(
        switch.contains("alice") && switch.contains("cp-convo"),
        "decided by the leader for alice: {switch}"
    );
}

/// Two servers on one PostgreSQL: the switches thrown at the standby are
/// decided by the leader, and a thread or a note written through one
/// server is read through the other (the tables are the store's, not a
/// server's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_share_threads_and_notes_and_the_standby_forwards_the_switches() {
    use super::tenancy::new_key;
    use reqwest::Method;
    let (store, _scratch) = Scratch::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let extra = "auth: {enabled: true, flush_interval: 50ms}\n\
                 conversations: {default_context: 100000}\n";
    let a = start(&config(
        dir.path(),
        "cp-a",
        &store,
        &e,
        Mode::Control,
        extra,
    ));
    leads(&a.admin).await;
    let b = start(&config(
        dir.path(),
        "cp-b",
        &store,
        &e,
        Mode::Control,
        extra,
    ));
    tree(&store, &b.admin);
    let (kp, _) = new_key(&store, &b.admin, "agent");
    keys_ok(
        &store,
        &b.admin,
        &["threads", "--project", "p", "--capture"],
    );
    keys_ok(
        &store,
        &b.admin,
        &["memory", "--project", "p", "--retain-hours", "24"],
    );
    let (ca, cb) = (
        Client {
            http: reqwest::Client::new(),
            base: a.base.clone(),
        },
        Client {
            http: reqwest::Client::new(),
            base: b.base.clone(),
        },
    );
    // Each server's views follow the log: both see the switch in time.
    for c in [&ca, &cb] {
        until("the server to see the switch", || async {
            let r = c.memory(&kp, None, Method::GET, "/none", None).await;
            (r.0 == 404).then_some(())
        })
        .await;
    }

    let sys = ("system", "be brief");
    let u1 = "tell me about racks";
    let (a1, _, _) = ca
        .turn(
            &kp,
            "shared",
            "free",
            json!([{"role": "system", "content": sys.1}, {"role": "user", "content": u1}]),
        )
        .await;
    let (_, tokens, _) = cb
        .turn(
            &kp,
            "shared",
            "free",
            json!([{"role": "user", "content": "and?"}]),
        )
        .await;
    assert_eq!(
        tokens,
        sim_tokens(&[sys, ("user", u1), ("assistant", &a1), ("user", "and?")]),
        "the standby's gateway sent the history the leader's kept"
    );

    let (status, _) = cb
        .memory(
            &kp,
            Some("ops"),
            Method::PUT,
            "/racks",
            Some(json!({"text": "one rack at a time", "tags": ["ops"]})),
        )
        .await;
    assert_eq!(status, 201);
    let (status, v) = ca
        .memory(&kp, Some("ops"), Method::GET, "/racks", None)
        .await;
    assert_eq!(
        (status, v["text"].as_str()),
        (200, Some("one rack at a time"))
    );

    let events = super::ok(
        &store,
        &["events", "tail", "--json", "--from", "1", "--limit", "1000"],
    );
    for kind in ["ThreadsSet", "MemorySet"] {
        let switch = super::json_lines(&events)
            .into_iter()
            .find(|e| e["event_type"] == kind)
            .unwrap_or_else(|| panic!("{kind} is in the log"));
        assert_eq!(
            switch["metadata"]["writer"], "cp-a",
            "the leader decided it: {switch}"
        );
        assert_eq!(switch["metadata"]["actor"], "alice");
    }
}

/// An answer that breaks off keeps nothing of its turn, so the client's
/// retry does not repeat it: the engine is killed mid-stream, the client
/// is told in the stream, and the thread holds nothing (it held the
/// question and the partial reply, and a retry doubled the question).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_answer_breaks_off_is_not_kept() {
    use tokio_stream::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let (_scratch, mut slow, _server, kp, c) =
        slow_threads(Backend::Sqlite, dir.path(), "cut").await;
    let ask = json!({"model": "paid", "stream": true, "max_tokens": 200,
        "messages": [{"role": "user", "content": "tell me a long story"}]});
    let r = c.chat(&kp, "cut", ask).await;
    assert_eq!(r.status(), 200);
    let mut body = Box::pin(r.bytes_stream());
    let mut raw = Vec::new();
    while !String::from_utf8_lossy(&raw).contains("\"content\"") {
        raw.extend_from_slice(&body.next().await.expect("more").unwrap());
    }
    slow.process.kill().unwrap();
    while let Some(Ok(chunk)) = body.next().await {
        raw.extend_from_slice(&chunk);
    }
    let said = String::from_utf8_lossy(&raw);
    assert!(said.contains("\"error\""), "told in the stream: {said}");
    let kept = c
        .http
        .get(format!("{}/v1/threads/cut", c.base))
        .bearer_auth(&kp)
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 404, "{}", kept.text().await.unwrap());
}

/// A router-only server with keys on before a slow engine (40 tokens a
/// second, so an answer is still running when the test acts), project p
/// keeping threads with its replies: the store's scratch, the engine, the
/// server, p's key and a client.
async fn slow_threads(
    backend: Backend,
    dir: &std::path::Path,
    name: &str,
) -> (
    Scratch,
    super::Child,
    super::tenancy::Server,
    String,
    Client,
) {
    let (store, scratch) = Scratch::new(backend).await;
    let slow = super::Child::spawn(&[
        "sim-engine",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "paid",
        "--tps",
        "40",
    ]);
    let e = slow.addr_after("listening on ");
    let extra = "auth: {enabled: true, flush_interval: 50ms}\n";
    let server = start(&config(dir, name, &store, &e, Mode::RouterOnly, extra));
    let tree = ["init", "--org", "o", "--team", "t", "--project", "p"];
    keys_ok(&store, &server.admin, &tree);
    keys_ok(
        &store,
        &server.admin,
        &["threads", "--project", "p", "--capture"],
    );
    let kp = key_for(&store, &server.admin, "p");
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    (scratch, slow, server, kp, c)
}

/// A turn the store cannot keep (a lock held past its timeout) is not
/// answered as if kept: the answer's end is cut, so the client sees the
/// turn fail and sends it again; it read a whole 200 and went on with a
/// thread that lacked the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_the_store_cannot_keep_is_not_answered_as_kept() {
    use sqlx::{Connection, Executor};
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, _) = setup(Backend::Postgres, dir.path()).await;
    keys_ok(
        &store,
        &server.admin,
        &["threads", "--project", "p", "--capture"],
    );
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let hello = json!([{"role": "user", "content": "hello"}]);
    // The switch reached the server once a turn is taken.
    until("threads on", || async {
        let r = c
            .chat(
                &kp,
                "warm",
                json!({"model": "paid", "max_tokens": 2, "messages": hello}),
            )
            .await;
        (r.status() == 200).then_some(())
    })
    .await;
    // Every write of a turn waits on this lock, past the store's timeout.
    let mut pg = sqlx::PgConnection::connect(&store).await.unwrap();
    pg.execute("BEGIN").await.unwrap();
    pg.execute("LOCK TABLE convo_turns IN EXCLUSIVE MODE")
        .await
        .unwrap();
    for stream in [false, true] {
        let thread = format!("locked-{stream}");
        let r = c
            .chat(
                &kp,
                &thread,
                json!({"model": "paid", "max_tokens": 2, "stream": stream, "messages": hello}),
            )
            .await;
        assert_eq!(r.status(), 200, "the head goes before the turn is kept");
        assert!(r.bytes().await.is_err(), "stream {stream}: the end is cut");
    }
    pg.execute("COMMIT").await.unwrap();
    for stream in [false, true] {
        let kept = c
            .http
            .get(format!("{}/v1/threads/locked-{stream}", c.base))
            .bearer_auth(&kp)
            .send()
            .await
            .unwrap();
        assert_eq!(kept.status(), 404, "nothing of it was kept");
    }
}

/// Servers of two kinds on one store, both sweeping: one with keys
/// (projects pa and pb) and one without, whose `threads:` block keeps the
/// ownerless pool. Each deletes only what it keeps: the keyless server's
/// first sweep deleted every project's threads and notes, and the keyed
/// server deleted the pool's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_sweeps_only_what_it_keeps() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch) = Scratch::new(Backend::Sqlite).await;
    let engine = engine();
    let e = engine.addr_after("listening on ");
    let sweep = "conversations: {sweep_interval: 100ms}\n";
    let keyed = start(&config(
        dir.path(),
        "keyed",
        &store,
        &e,
        Mode::RouterOnly,
        &format!("auth: {{enabled: true, flush_interval: 50ms}}\n{sweep}"),
    ));
    let c = Client {
        http: reqwest::Client::new(),
        base: keyed.base.clone(),
    };
    let hello = json!([{"role": "user", "content": "hello"}]);
    for p in ["pa", "pb"] {
        let tree = ["init", "--org", "o", "--team", "t", "--project", p];
        keys_ok(&store, &keyed.admin, &tree);
        keys_ok(&store, &keyed.admin, &["threads", "--project", p]);
        let memory = ["memory", "--project", p, "--retain-hours", "24"];
        keys_ok(&store, &keyed.admin, &memory);
        let key = key_for(&store, &keyed.admin, p);
        c.turn(&key, "t", "paid", hello.clone()).await;
        let note = Some(json!({"text": "x"}));
        let (status, _) = c.memory(&key, None, Method::PUT, "/n", note).await;
        assert_eq!(status, 201);
    }
    // The pool's threads, as the keyless server keeps them: one unwritten
    // past its two hours, one fresh.
    let log = open_log(&store).await;
    let tables = llmgw_convo::Convo::new(&log);
    let turn = [json!({"role": "user", "content": "hello"})];
    let now = chrono::Utc::now();
    let stale = now - chrono::TimeDelta::hours(3);
    tables.append("", "stale", &turn, stale).await.unwrap();
    tables.append("", "fresh", &turn, now).await.unwrap();
    let notes_of = |p: &str| llmgw_convo::Owner {
        project: p.into(),
        agent: "default".into(),
    };

    // The keyless server's first sweep, at its start: the pool's stale
    // thread, and nothing of the projects.
    let keyless = start(&config(
        dir.path(),
        "keyless",
        &store,
        &e,
        Mode::RouterOnly,
        &format!("threads: {{retain_hours: 2}}\n{sweep}"),
    ));
    let swept = super::Child::expect(&keyless.child.stderr, "swept conversations");
    assert!(swept.contains("threads=1 notes=0"), "{swept}");
    assert!(tables.history("", "stale").await.unwrap().is_empty());
    for p in ["pa", "pb"] {
        assert_eq!(tables.history(p, "t").await.unwrap().len(), 1, "{p}");
        let note = tables.note(&notes_of(p), "n").await.unwrap();
        assert!(note.is_some(), "{p}'s note");
    }

    // The keyed server deletes pb's threads once pb switches them off,
    // and leaves the pool's.
    keys_ok(
        &store,
        &keyed.admin,
        &["threads", "--project", "pb", "--off"],
    );
    let swept = super::Child::expect(&keyed.child.stderr, "swept conversations");
    assert!(swept.contains("threads=1 notes=0"), "{swept}");
    assert!(tables.history("pb", "t").await.unwrap().is_empty());
    assert_eq!(tables.history("pa", "t").await.unwrap().len(), 1);
    assert_eq!(
        tables.history("", "fresh").await.unwrap().len(),
        1,
        "the pool's thread"
    );
}

/// Switched off, a project keeps no more, but until the sweep deletes
/// what it kept, its clients can still read and delete their own threads
/// and notes (they were refused: 403 threads_off, "this request would
/// lose its history"). Erasing a person of the project says that its
/// threads and notes are not erased, and how an operator deletes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_and_deletes_its_own_after_the_switch_is_off() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    // One sweep, at the start: none while the test runs.
    let (store, _scratch, _engine, server, kp, _) =
        setup_sweeping(Backend::Sqlite, dir.path(), "1h").await;
    keys_ok(&store, &server.admin, &["threads", "--project", "p"]);
    let memory = ["memory", "--project", "p", "--retain-hours", "24"];
    keys_ok(&store, &server.admin, &memory);
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let hello = json!([{"role": "user", "content": "hello"}]);
    for thread in ["mine", "other"] {
        c.turn(&kp, thread, "paid", hello.clone()).await;
    }
    for key in ["/plan", "/lunch"] {
        let note = Some(json!({"text": "curry on fridays"}));
        let (status, _) = c.memory(&kp, None, Method::PUT, key, note).await;
        assert_eq!(status, 201);
    }
    let thread = |method: Method, id: &str| {
        c.http
            .request(method, format!("{}/v1/threads/{id}", c.base))
            .bearer_auth(&kp)
            .send()
    };

    // Erasure leaves the project's threads and notes, and says so.
    let id = super::web::users(
        &store,
        &server.admin,
        &[
            "add",
            "--email",
            "gina@example.com",
            "--project",
            "p",
            "--password",
            "correct horse battery staple",
        ],
    );
    let said = super::web::users(&store, &server.admin, &["erase", id.trim()]);
    assert!(said.contains("personal data is erased"), "{said}");
    assert!(
        said.contains("Not erased: the threads and memory notes kept for project p"),
        "{said}"
    );
    for off in [
        "llmgw keys threads --project p --off",
        "llmgw keys memory --project p --off",
    ] {
        assert!(said.contains(off), "{said}");
    }
    assert_eq!(thread(Method::GET, "mine").await.unwrap().status(), 200);

    keys_ok(
        &store,
        &server.admin,
        &["threads", "--project", "p", "--off"],
    );
    keys_ok(
        &store,
        &server.admin,
        &["memory", "--project", "p", "--off"],
    );
    // Nothing more is kept...
    let r = c
        .chat(&kp, "mine", json!({"model": "paid", "messages": hello}))
        .await;
    assert_eq!(r.status(), 403);
    let note = Some(json!({"text": "x"}));
    let (status, v) = c.memory(&kp, None, Method::PUT, "/late", note).await;
    assert_eq!(status, 403);
    assert!(message(&v).contains("keeps no memory notes"), "{v}");

    // ...but what was kept is still the client's to read and delete.
    let r = thread(Method::GET, "mine").await.unwrap();
    assert_eq!(r.status(), 200);
    let kept: Value = r.json().await.unwrap();
    assert_eq!(kept["messages"][0]["content"], "hello", "{kept}");
    assert_eq!(thread(Method::DELETE, "mine").await.unwrap().status(), 204);
    assert_eq!(thread(Method::GET, "mine").await.unwrap().status(), 404);
    assert_eq!(thread(Method::GET, "other").await.unwrap().status(), 200);
    let (status, v) = c.memory(&kp, None, Method::GET, "/plan", None).await;
    assert_eq!((status, &v["text"]), (200, &json!("curry on fridays")));
    let (status, v) = c.memory(&kp, None, Method::GET, "?q=curry", None).await;
    assert_eq!((status, v["data"].as_array().map(Vec::len)), (200, Some(2)));
    let (status, _) = c.memory(&kp, None, Method::DELETE, "/lunch", None).await;
    assert_eq!(status, 204);
    // And through MCP: recall and forget reach, remember is refused.
    let tool = |name: &str, arguments: Value| {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}});
        rpc(&c, &kp, None, call)
    };
    let (_, v) = tool("recall", json!({"key": "plan"})).await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let (_, v) = tool("forget", json!({"key": "plan"})).await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let (_, v) = tool("remember", json!({"key": "k", "text": "x"})).await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    let (status, _) = c.memory(&kp, None, Method::GET, "/plan", None).await;
    assert_eq!(status, 404);
}

/// A raw JSON-RPC POST to /mcp with `key`, naming `version` in
/// MCP-Protocol-Version: the status and the body (null when none).
async fn rpc(c: &Client, key: &str, version: Option<&str>, body: Value) -> (u16, Value) {
    let mut r = c
        .http
        .post(format!("{}/mcp", c.base))
        .bearer_auth(key)
        .json(&body);
    if let Some(v) = version {
        r = r.header("mcp-protocol-version", v);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// /mcp answers as JSON-RPC 2.0 and MCP's transport say, in raw
/// requests: an unknown tool, or none named, is Invalid params (-32602;
/// it was a tool result marked as an error); a message without
/// "jsonrpc": "2.0", or a request whose id is null, is an Invalid Request
/// (-32600); a protocol version the server does not speak is 400. A
/// batch is answered where the version has them (2025-03-26, which a
/// request without the header is read as) and refused where it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_json_rpc_as_the_specification_says() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, _) = setup(Backend::Sqlite, dir.path()).await;
    let memory = ["memory", "--project", "p", "--retain-hours", "24"];
    keys_ok(&store, &server.admin, &memory);
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let call = |id: u64, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let ping = |id: Value| json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
    let error = |v: &Value| (v["id"].clone(), v["error"]["code"].as_i64());

    for (body, id, code) in [
        (
            call(1, json!({"name": "nope", "arguments": {}})),
            json!(1),
            -32602,
        ),
        (call(2, json!({"arguments": {}})), json!(2), -32602),
        (json!({"id": 3, "method": "ping"}), json!(3), -32600),
        (
            json!({"jsonrpc": "1.0", "id": 4, "method": "ping"}),
            json!(4),
            -32600,
        ),
        (ping(Value::Null), Value::Null, -32600),
        (json!({"jsonrpc": "2.0", "id": 5}), json!(5), -32600),
    ] {
        let (status, v) = rpc(&c, &kp, None, body.clone()).await;
        assert_eq!(status, 200, "{body}: {v}");
        assert_eq!(error(&v), (id, Some(code)), "{body}: {v}");
        assert!(v.get("result").is_none(), "{v}");
    }

    let (status, v) = rpc(&c, &kp, Some("2099-01-01"), ping(json!(6))).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2099-01-01")
    );
    let (status, v) = rpc(&c, &kp, Some("2025-06-18"), ping(json!(7))).await;
    assert_eq!((status, &v["result"]), (200, &json!({})), "{v}");

    // A batch, answered in its order; a notification in it has no answer.
    let batch = json!([
        ping(json!(8)),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        call(9, json!({"name": "remember", "arguments": {"key": "b", "text": "batched"}})),
        {"jsonrpc": "2.0", "id": 10, "method": "initialize", "params": {}},
    ]);
    for version in [None, Some("2025-03-26")] {
        let (status, v) = rpc(&c, &kp, version, batch.clone()).await;
        assert_eq!(status, 200, "{v}");
        let answers = v.as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(answers.len(), 3, "{v}");
        assert_eq!(answers[0]["id"], 8);
        assert_eq!(answers[1]["result"]["isError"], false, "{v}");
        assert_eq!(error(&answers[2]), (json!(10), Some(-32600)), "{v}");
    }
    let (status, v) = c.memory(&kp, None, Method::GET, "/b", None).await;
    assert_eq!((status, &v["text"]), (200, &json!("batched")));
    let notified = json!([{"jsonrpc": "2.0", "method": "notifications/initialized"}]);
    let (status, _) = rpc(&c, &kp, None, notified).await;
    assert_eq!(status, 202);
    let (_, v) = rpc(&c, &kp, None, json!([])).await;
    assert_eq!(error(&v), (Value::Null, Some(-32600)), "{v}");
    // 2025-06-18 took batches out.
    let (_, v) = rpc(&c, &kp, Some("2025-06-18"), json!([ping(json!(11))])).await;
    assert_eq!(error(&v), (Value::Null, Some(-32600)), "{v}");
}

/// A thread deleted while a turn is answered stays deleted: the turn's
/// closing write made it again, holding the turn in flight, though the
/// DELETE had answered 204.
async fn a_thread_deleted_during_a_turn_stays_deleted(backend: Backend) {
    use tokio_stream::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let (_scratch, _slow, _server, kp, c) = slow_threads(backend, dir.path(), "del").await;
    let thread = |method: reqwest::Method| {
        c.http
            .request(method, format!("{}/v1/threads/del1", c.base))
            .bearer_auth(&kp)
            .send()
    };
    c.turn(
        &kp,
        "del1",
        "paid",
        json!([{"role": "user", "content": "hi"}]),
    )
    .await;
    // A second turn, two seconds long: deleted once its answer begins.
    let ask = json!({"model": "paid", "stream": true, "max_tokens": 80,
        "messages": [{"role": "user", "content": "tell me a long story"}]});
    let r = c.chat(&kp, "del1", ask).await;
    assert_eq!(r.status(), 200);
    let mut body = Box::pin(r.bytes_stream());
    let mut raw = Vec::new();
    while !String::from_utf8_lossy(&raw).contains("\"content\"") {
        raw.extend_from_slice(&body.next().await.expect("more").unwrap());
    }
    let deleted = thread(reqwest::Method::DELETE).await.unwrap();
    assert_eq!(deleted.status(), 204);
    // The turn is over once its answer has been read whole.
    while let Some(chunk) = body.next().await {
        raw.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&raw).contains("[DONE]"));
    let kept = thread(reqwest::Method::GET).await.unwrap();
    assert_eq!(kept.status(), 404, "{}", kept.text().await.unwrap());
}

on_both! {
    deleting_during_a_turn_on_sqlite: a_thread_deleted_during_a_turn_stays_deleted(Backend::Sqlite);
    deleting_during_a_turn_on_postgres: a_thread_deleted_during_a_turn_stays_deleted(Backend::Postgres);
}

/// The access line of a request on a note, a thread or MCP names its key,
/// as a chat completion's does: nothing recorded which key wrote or
/// deleted a note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_line_names_the_key_on_notes_threads_and_mcp() {
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let (store, _scratch, _engine, server, kp, _) = setup(Backend::Sqlite, dir.path()).await;
    keys_ok(&store, &server.admin, &["threads", "--project", "p"]);
    let memory = ["memory", "--project", "p", "--retain-hours", "24"];
    keys_ok(&store, &server.admin, &memory);
    let c = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let log = &server.child.stderr;
    // The next access line for `path`.
    let line_of = |path: &str| loop {
        let line = super::Child::expect(log, "llmgw::access");
        if line.contains(&format!("path=\"{path}\"")) {
            return line;
        }
    };
    let hello = json!([{"role": "user", "content": "hello"}]);
    c.turn(&kp, "t", "paid", hello).await;
    let chat = line_of("/v1/chat/completions");
    let key_id = chat
        .split_whitespace()
        .find(|f| f.starts_with("key_id=\"key-"))
        .unwrap_or_else(|| panic!("{chat}"))
        .to_owned();

    let note = Some(json!({"text": "x"}));
    let (status, _) = c.memory(&kp, None, Method::PUT, "/plan", note).await;
    assert_eq!(status, 201);
    assert!(line_of("/v1/memory/plan").contains(&key_id));
    let (status, _) = c.memory(&kp, None, Method::DELETE, "/plan", None).await;
    assert_eq!(status, 204);
    let deleted = line_of("/v1/memory/plan");
    assert!(
        deleted.contains(&key_id) && deleted.contains("DELETE"),
        "{deleted}"
    );
    let (status, _) = c.memory(&kp, None, Method::GET, "?q=x", None).await;
    assert_eq!(status, 200);
    assert!(line_of("/v1/memory").contains(&key_id));
    let r = c
        .http
        .delete(format!("{}/v1/threads/t", c.base))
        .bearer_auth(&kp)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(line_of("/v1/threads/t").contains(&key_id));
    let (status, _) = rpc(
        &c,
        &kp,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(line_of("/mcp").contains(&key_id));
    // A request without a good key names none.
    let (status, _) = c.memory("nope", None, Method::GET, "/plan", None).await;
    assert_eq!(status, 401);
    assert!(!line_of("/v1/memory/plan").contains("key_id"));
}
