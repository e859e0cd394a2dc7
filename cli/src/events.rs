use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use llmgw_eventstore::{AnyStore, DEFAULT_PAGE, EventFilter, EventStore, RecordedEvent};

use crate::Outcome;
use crate::output::{EVENT_HEADER, Table, event_cells, event_line, json_line};

mod anchors;
mod capture;
mod file;
pub(crate) mod filter;
mod history;
mod import;
pub(crate) mod shown;
mod usage;
mod verify_file;

#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// The newest events, or those from a position on; --follow keeps
    /// printing new ones as they are appended.
    Tail {
        /// Keep printing events as they are appended (Ctrl-C stops).
        #[arg(long)]
        follow: bool,
        /// Only events of these types: a comma-separated list, where a
        /// trailing * stands for any ending (NodeLost,Replica*).
        #[arg(long = "type", value_name = "TYPES")]
        types: Option<filter::TypePatterns>,
        /// Only events by this actor: the person, or the server or gateway
        /// acting on its own, as the BY column of `events log` names it.
        #[arg(long, value_name = "NAME")]
        actor: Option<String>,
        /// First position to print (default: the last --limit events).
        #[arg(long)]
        from: Option<u64>,
        /// How many events to print before following (default 20 without
        /// --from, all with it); with --type or --actor, how many of those.
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON lines (one object a line) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One event, whole, exactly as stored.
    Show {
        /// The event's position in the log.
        position: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Recompute the hash chain and report the first position that does not
    /// match. Exits 1 when it finds one. With --file, check an export
    /// instead: on its own (consistent in itself, and with its trailer),
    /// against the store it came from, or against anchors held from it.
    Verify {
        /// First position to check.
        #[arg(long, default_value_t = 1, conflicts_with = "file")]
        from: u64,
        /// Last position to check (default: the head).
        #[arg(long, conflicts_with = "file")]
        to: Option<u64>,
        /// An export to check instead of the store (`-` for standard
        /// input); --store is refused with it (name the store with
        /// --against).
        #[arg(long, value_name = "X.jsonl")]
        file: Option<PathBuf>,
        /// The store the export should be part of (an address as for
        /// --store): its events must be the file's, hash for hash.
        #[arg(long, value_name = "STORE", requires = "file")]
        against: Option<String>,
        /// A hash the file must have at a position, held from the source
        /// (`events stats` prints the chain head as HASH@POSITION). May be
        /// given more than once.
        #[arg(long, value_name = "HASH@POSITION", requires = "file")]
        anchor: Vec<file::Anchor>,
        /// The lines a leader handed its anchor sink (`control.anchors`):
        /// the store must hold each one's hash at its position, and each
        /// signed line must verify (with --public-key, every line must be
        /// signed by that key).
        #[arg(long, value_name = "FILE", conflicts_with = "file")]
        anchors: Option<PathBuf>,
        /// The server's public key (64 hex digits, or a file with them or a
        /// PEM public key): the trailer (with --file) or every anchor line
        /// (with --anchors) must be signed by it. Without it a signature
        /// is checked against the key it names, which proves nothing about
        /// who signed.
        #[arg(long, value_name = "KEY")]
        public_key: Option<file::KeyArg>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write events as JSON lines, one per line, as stored; `events import`
    /// reads them back. A range that starts after position 1 names the hash
    /// of the event before it on its first line (`prev_hash`), so that an
    /// import can check where it joins.
    Export {
        /// First position to write.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Last position to write (default: the head).
        #[arg(long)]
        to: Option<u64>,
        /// File to write (default: standard output).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Sign the trailer with this Ed25519 private key (a PEM file, as
        /// `server init` or `openssl genpkey -algorithm ed25519` writes):
        /// the server's `signing_key`, so that a forger needs the key too.
        #[arg(long, value_name = "PATH", env = "LLMGW_SIGNING_KEY")]
        sign_key: Option<PathBuf>,
    },
    /// Copy the events of an export (JSON lines) into this store exactly as
    /// they were: positions, times, epochs and hashes, so the copy's chain
    /// head is the source's. All or nothing, in one transaction. The file
    /// must continue this store's log: an empty store takes a file from
    /// position 1; a store with events takes a file that links to its head
    /// (events it already holds are checked by hash and skipped, so running
    /// it again writes nothing). Takes the append lease while it runs, so
    /// run it with no server holding it. Creates the store's schema if it
    /// has none.
    Import {
        /// The export to read; `-` for standard input.
        #[arg(default_value = "-")]
        input: PathBuf,
        /// Accept an export that starts after position 1 into an empty
        /// store, trusting the hash its first line names for the position
        /// before it: the store then begins there, and nothing can check
        /// that link.
        #[arg(long)]
        from_anchor: bool,
        /// A hash the file must have at a position, as held from the source
        /// (`events stats` prints the chain head as HASH@POSITION): refuses
        /// an edit whose later hashes were recomputed, and a file cut short
        /// before the position. May be given more than once.
        #[arg(long, value_name = "HASH@POSITION")]
        anchor: Vec<file::Anchor>,
        /// The source server's public key: the file's trailer must be
        /// signed by it (64 hex digits, or a file with them or a PEM key).
        #[arg(long, value_name = "KEY")]
        public_key: Option<file::KeyArg>,
    },
    /// A view as it stood at a position or time.
    Replay {
        /// A position, or a time: 2026-12-01T10:00:00Z, "2026-12-01
        /// 10:00:00" (UTC), or a date; a time includes its last written
        /// unit (a date, the whole day; 10:00:00.123, that millisecond).
        #[arg(long, value_name = "POSITION|TIME")]
        until: history::Point,
        /// router, cluster, tenancy or usage.
        #[arg(long)]
        view: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The history of one thing as a timeline: who did what, when.
    #[command(group = clap::ArgGroup::new("thing").required(true))]
    Log {
        /// A stream id, such as node-gpu-a-01.
        #[arg(long, group = "thing")]
        stream: Option<String>,
        /// A node: its stream (`node-ID`), the commands refused about it,
        /// and the replicas placed there with the states of their shards on
        /// it.
        #[arg(long, group = "thing")]
        node: Option<String>,
        /// A model: its stream (`model-NAME`), the commands refused about
        /// it, and every replica of it (placed, its shards' states, ready,
        /// failed, stopped).
        #[arg(long, group = "thing")]
        model: Option<String>,
        /// An API key, by id: its stream (issued, limited, revoked), refusals,
        /// and its owner's erasure, which stops it.
        #[arg(long, group = "thing")]
        key: Option<String>,
        /// A person, by user id (`users list` shows it): their stream
        /// (signed up, approved, suspended, erased), the commands refused
        /// about them, and the keys they made for themselves.
        #[arg(long, group = "thing")]
        user: Option<String>,
        /// Print JSON lines (one object a line) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// What changed in a view between two points.
    Diff {
        /// The earlier point: a position (the view there), or a time (the
        /// view just before it: 2026-12-01T10:00:00Z, "2026-12-01
        /// 10:00:00" in UTC, or a date).
        #[arg(long, value_name = "POSITION|TIME")]
        from: history::Point,
        /// The later point: a position, or a time written as for --from,
        /// its last written unit included (a date, the whole day).
        #[arg(long, value_name = "POSITION|TIME")]
        to: history::Point,
        /// router, cluster, tenancy or usage.
        #[arg(long)]
        view: String,
        /// Print JSON lines (one object a line) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Turn an incident into a replay test: writes
    /// replay-tests/fixtures/NAME.jsonl (the range, exactly as stored,
    /// with a header holding the control plane's timings and a trailer),
    /// a test that replays it (tests/it/captured/NAME.rs) and its first
    /// snapshot, the incident's story. Run it at the root of a checkout.
    Capture {
        /// The fixture's name: lowercase words and dashes
        /// (node-lost-on-gpu-b).
        name: String,
        /// The first position, or a time (the first event at or after it).
        #[arg(long, value_name = "POSITION|TIME")]
        from: history::Point,
        /// The last position, or a time (the last event within it: a date,
        /// that whole day; 10:00:00.123, that millisecond).
        #[arg(long, value_name = "POSITION|TIME")]
        to: history::Point,
        /// The replay-tests crate to write into.
        #[arg(long, value_name = "DIR", default_value = "replay-tests")]
        dir: PathBuf,
        /// Sign the fixture's trailer with this Ed25519 private key (PEM).
        #[arg(long, value_name = "PATH", env = "LLMGW_SIGNING_KEY")]
        sign_key: Option<PathBuf>,
    },
    /// Requests, tokens and cost from the log's usage, added up by key,
    /// project, person, model (the one that served) or UTC day, over a
    /// window: a table with a total, CSV or JSON lines. The requests are
    /// those usage records: each an engine answered (a refusal before, and
    /// a request no engine answered, cost nothing and are not there);
    /// errors are those answered 400 or more, a client leaving mid-answer
    /// (499) among them.
    Usage {
        /// The first moment counted: a time (2026-12-01T10:00:00Z,
        /// "2026-12-01 10:00:00" in UTC), a date, or a span back from now
        /// (30s, 10m, 24h, 7d). Default: the log's beginning.
        #[arg(long, value_name = "TIME")]
        since: Option<usage::Moment>,
        /// The last moment counted, written as for --since, through the
        /// unit written: a date counts that whole day, a time that whole
        /// second. Adjacent windows start the next unit (--until
        /// 2026-11-30, then --since 2026-12-01). Default: now.
        #[arg(long, value_name = "TIME")]
        until: Option<usage::Moment>,
        /// What a row stands for: key, project, model, day, person, or
        /// several, comma-separated. A person's row is their own keys and
        /// their chat on the pages together (as the admin usage page counts
        /// them); keys made without an owner are together as (operators).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "project,model"
        )]
        by: Vec<usage::By>,
        /// Print CSV (a header line, then a line a row; cost in micro-dollars
        /// and dollars) instead of a table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Print JSON lines (one object a row) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Event count, head position, the chain head as HASH@POSITION (an
    /// anchor for `events import --anchor`), and counts per event type.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(address: &str, cmd: EventsCommand) -> anyhow::Result<Outcome> {
    if let EventsCommand::Import {
        input,
        from_anchor,
        anchor,
        public_key,
    } = cmd
    {
        let key = public_key.map(|k| k.0);
        match import_into(address, &input, from_anchor, &anchor, key).await? {
            Some(done) => {
                import::tell(&done.imported);
                import::tell_erased(&done.erased);
            }
            None => println!("nothing to import"),
        }
        return Ok(Outcome::Ok);
    }
    if let EventsCommand::Verify {
        file: Some(file),
        against,
        anchor,
        public_key,
        json,
        ..
    } = &cmd
    {
        let key = public_key.map(|k| k.0);
        return verify_file::run(file, against.as_deref(), anchor, key, *json).await;
    }
    let store = crate::store::open_reading(address).await?;
    match cmd {
        EventsCommand::Tail {
            follow,
            types,
            actor,
            from,
            limit,
            json,
        } => {
            if follow && store.is_snapshot() {
                anyhow::bail!(
                    "{address}: its directory cannot be written here, so the log is read as it is now, without a writer's newest events: --follow would wait for nothing. Run it as a user who may write the directory, or leave --follow out"
                );
            }
            let filter = filter::Filter { types, actor };
            tail(&store, follow, from, limit, json, &filter).await
        }
        EventsCommand::Show { position, json } => show(&store, position, json).await,
        EventsCommand::Verify {
            from,
            to,
            json,
            anchors,
            public_key,
            ..
        } => {
            let held = match anchors {
                Some(path) => {
                    let key = public_key.map(|k| k.0);
                    Some((
                        path.clone(),
                        anchors::check(&store, &path, key.as_ref()).await?,
                    ))
                }
                None if public_key.is_some() => bail!(
                    "--public-key checks a signature: give --file (an export) or --anchors (an anchor sink's lines)"
                ),
                None => None,
            };
            verify(&store, from, to, json, held).await
        }
        EventsCommand::Export {
            from,
            to,
            output,
            sign_key,
        } => export(&store, from, to, output, sign_key).await,
        EventsCommand::Import { .. } => unreachable!("handled above"),
        EventsCommand::Stats { json } => stats(&store, json).await,
        EventsCommand::Usage {
            since,
            until,
            by,
            csv,
            json,
        } => {
            let format = match (csv, json) {
                (true, _) => usage::Format::Csv,
                (_, true) => usage::Format::Json,
                _ => usage::Format::Table,
            };
            usage::report(&store, since, until, &by, format).await
        }
        EventsCommand::Capture {
            name,
            from,
            to,
            dir,
            sign_key,
        } => {
            let args = capture::Args {
                name,
                from,
                to,
                dir,
                sign_key,
            };
            capture::run(&store, args).await
        }
        EventsCommand::Replay { until, view, json } => {
            history::replay(&store, until, &view, json).await
        }
        EventsCommand::Diff {
            from,
            to,
            view,
            json,
        } => history::diff(&store, from, to, &view, json).await,
        EventsCommand::Log {
            stream,
            node,
            model,
            key,
            user,
            json,
        } => {
            let thing = match (stream, node, model, key, user) {
                (Some(s), ..) => history::Thing::Stream(s),
                (_, Some(n), ..) => history::Thing::Node(n),
                (_, _, Some(m), ..) => history::Thing::Model(m),
                (_, _, _, Some(k), _) => history::Thing::Stream(format!("key-{k}")),
                (.., Some(u)) => history::Thing::User(u),
                _ => bail!("say which thing: --stream, --node, --model, --key or --user"),
            };
            history::log(&store, &thing, json).await
        }
    }
}

/// The whole log of `store` into the store at `to` (made or migrated),
/// through an export file written aside and removed after, so that the
/// copy passes the checks an import makes of a file (every hash, the
/// chain, the trailer). What was written, for the caller to say (the
/// file is gone by then, so it is never named); None: the log is empty.
pub(crate) async fn copy_log(
    store: &AnyStore,
    to: &str,
) -> anyhow::Result<Option<llmgw_eventstore::Imported>> {
    let (head, _) = store.head().await?;
    if head == 0 {
        return Ok(None);
    }
    // In a directory of its own, made here (it fails if the name is
    // taken), readable by this user alone: the log holds tenancy data,
    // and nothing another user placed there is written through.
    let dir = std::env::temp_dir().join(format!(
        "llmgw-copy-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    ));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let aside = Aside(dir);
    let path = aside.0.join("log.jsonl");
    export_file(store, 1, head, head, None, &path).await?;
    let done = import_into(to, &path, false, &[], None).await?;
    Ok(done.map(|d| d.imported))
}

/// The directory a copy's export is written in, removed however the copy
/// ends: returned, failed, or dropped at a stop (`store copy` stopped with
/// Ctrl-C left the whole log there in plain text).
struct Aside(PathBuf);

impl Drop for Aside {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The chain head an import left, as HASH@POSITION (an anchor).
pub(crate) fn head_of(done: &llmgw_eventstore::Imported) -> String {
    file::Anchor {
        position: done.head,
        hash: done.head_hash,
    }
    .to_string()
}

/// What an import wrote, and whose personal data it then deleted.
struct ImportDone {
    imported: llmgw_eventstore::Imported,
    erased: Vec<String>,
}

/// An import may be the first thing a store receives: it gets its schema,
/// as a server would give it; but a refused import into a SQLite file it
/// created leaves no file behind. The people table then follows the
/// file's erasures. None: the file holds no event.
async fn import_into(
    address: &str,
    input: &std::path::Path,
    from_anchor: bool,
    anchors: &[file::Anchor],
    key: Option<llmgw_eventstore::signing::PublicKey>,
) -> anyhow::Result<Option<ImportDone>> {
    let Some(lines) = import::open(input, anchors, key)? else {
        return Ok(None);
    };
    let erased = lines.erased();
    let created = import::new_sqlite_file(address);
    let result = async {
        let store = crate::store::open_migrating(address).await?;
        let imported = import::run(&store, lines, from_anchor, anchors).await?;
        anyhow::Ok((store, imported))
    }
    .await;
    let (store, imported) = match result {
        Ok(done) => done,
        Err(e) => {
            if let Some(path) = created {
                for suffix in ["", "-wal", "-shm"] {
                    let mut p = path.clone().into_os_string();
                    p.push(suffix);
                    let _ = std::fs::remove_file(p);
                }
            }
            return Err(e);
        }
    };
    // After the events are in: a failure here keeps them (and the file).
    let erased = import::apply_erasures(&store, &erased).await?;
    // The file alone holds what came in (a copy of it is the log).
    store.fold_wal().await;
    Ok(Some(ImportDone { imported, erased }))
}

async fn tail(
    store: &AnyStore,
    follow: bool,
    from: Option<u64>,
    limit: Option<usize>,
    json: bool,
    filter: &filter::Filter,
) -> anyhow::Result<Outcome> {
    let (head, _) = store.head().await?;
    let mut out = std::io::stdout().lock();
    let mut table = Table::new(EVENT_HEADER.to_vec());
    let mut print = |out: &mut std::io::StdoutLock<'_>, e: &RecordedEvent| -> anyhow::Result<()> {
        if json {
            json_line(out, e)?;
        } else if follow {
            writeln!(out, "{}", shown::printable(&event_line(e)))?;
        } else {
            table.row(shown::cells(event_cells(e)));
        }
        Ok(())
    };
    let mut sub = match from {
        Some(0) => return Err(crate::config::ConfigError("positions start at 1".into()).into()),
        Some(p) => {
            let limit = limit.unwrap_or(usize::MAX);
            let mut sub = store.subscribe(p - 1);
            let mut printed = 0;
            while printed < limit {
                let Some(e) = sub.next_now().await? else {
                    break;
                };
                if filter.keeps(&e) {
                    print(&mut out, &e)?;
                    printed += 1;
                }
            }
            sub
        }
        None => {
            for e in newest(store, head, limit.unwrap_or(20), filter).await? {
                print(&mut out, &e)?;
            }
            store.subscribe(head)
        }
    };
    if !json && !follow {
        table.print(&mut out)?;
    }
    out.flush()?;
    if !follow {
        return Ok(Outcome::Ok);
    }
    drop(out);
    loop {
        let e = tokio::select! {
            e = sub.next() => e?,
            _ = tokio::signal::ctrl_c() => return Ok(Outcome::Ok),
        };
        if !filter.keeps(&e) {
            continue;
        }
        let mut out = std::io::stdout().lock();
        if json {
            json_line(&mut out, &e)?;
        } else {
            writeln!(out, "{}", shown::printable(&event_line(&e)))?;
        }
        out.flush()?;
    }
}

/// The newest `limit` events up to `head` that the filter keeps, oldest
/// first. Walks down from the head a page at a time, so a common filter
/// reads little; the store filters on an exact type itself.
async fn newest(
    store: &AnyStore,
    head: u64,
    limit: usize,
    filter: &filter::Filter,
) -> anyhow::Result<Vec<RecordedEvent>> {
    let narrow = EventFilter {
        event_type: filter
            .types
            .as_ref()
            .and_then(|t| t.single())
            .map(str::to_owned),
        ..EventFilter::default()
    };
    // Unfiltered, the newest `limit` are exactly what is wanted.
    let page_size = if filter.is_empty() {
        limit.clamp(1, DEFAULT_PAGE)
    } else {
        DEFAULT_PAGE
    };
    let mut found = Vec::new();
    let mut below = head + 1;
    while found.len() < limit && below > 1 {
        let page = store
            .read_backward_raw(&narrow, 0..below, page_size)
            .await?;
        let Some(last) = page.last() else {
            break;
        };
        below = last.position;
        let page = store.upcasters().upcast_all(page)?;
        found.extend(page.into_iter().filter(|e| filter.keeps(e)));
    }
    found.truncate(limit);
    found.reverse();
    Ok(found)
}

async fn show(store: &AnyStore, position: u64, json: bool) -> anyhow::Result<Outcome> {
    if position == 0 {
        return Err(crate::config::ConfigError("positions start at 1".into()).into());
    }
    let Some(e) = store.event_at(position).await? else {
        let (head, _) = store.head().await?;
        let (base, _) = store.base().await?;
        if position <= base {
            bail!(
                "no event at position {position}: this log begins after position {base} (it was imported from a later start)"
            );
        }
        bail!("no event at position {position} (the log's head is {head})");
    };
    let mut out = std::io::stdout().lock();
    if json {
        json_line(&mut out, &e)?;
    } else {
        let fields = [
            ("position", e.position.to_string()),
            (
                "stream",
                format!("{} @ version {}", e.stream_id, e.stream_version),
            ),
            (
                "type",
                format!("{} (schema v{})", e.event_type, e.schema_version),
            ),
            ("event id", e.event_id.to_string()),
            ("epoch", e.epoch.to_string()),
            ("recorded at", filter::when(e.recorded_at)),
            ("hash", llmgw_eventstore::hash::to_hex(&e.hash)),
            ("metadata", e.metadata.to_string()),
        ];
        for (k, v) in fields {
            writeln!(out, "{k:<12} {}", shown::printable(&v))?;
        }
        match crate::output::usage_rows(&e) {
            // Columns of hundreds of entries read badly one per line: a
            // batch is shown as its requests, one a line (`--json` prints
            // the payload as stored).
            Some((gateway, rows)) => {
                writeln!(out, "gateway      {}", shown::printable(&gateway))?;
                writeln!(out, "requests     {}", rows.len())?;
                let mut table = Vec::new();
                crate::output::usage_table(&rows).print(&mut table)?;
                write!(out, "{}", shown::lines(&String::from_utf8_lossy(&table)))?;
            }
            None => {
                // JSON escapes a newline in a string, not U+202E or C1.
                writeln!(out, "payload")?;
                let pretty = serde_json::to_string_pretty(&e.payload)?;
                write!(out, "{}", shown::lines(&pretty))?;
            }
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

/// How `events verify` reports the last anchor the log records.
pub(crate) fn log_anchor_line(a: &file::LogAnchor) -> String {
    let how = if a.checked {
        "matches the chain"
    } else {
        "not checked here: that position is not in what was verified"
    };
    format!(
        "last anchor: {} (recorded at position {}, {}): {how}; compare it with the anchor sink's copy",
        a.anchor,
        a.event,
        filter::when(a.recorded_at)
    )
}

/// The last anchor the log recorded up to `to`, checked against the
/// store's hash at the position it names: `Err` when they differ.
async fn last_log_anchor(
    store: &AnyStore,
    to: u64,
) -> anyhow::Result<Option<Result<file::LogAnchor, String>>> {
    let filter = EventFilter {
        streams: vec!["anchors".into()],
        ..EventFilter::default()
    };
    let found = store.read_backward_raw(&filter, 0..to + 1, 1).await?;
    let Some(e) = found.first() else {
        return Ok(None);
    };
    let Some(anchor) = file::recorded_anchor(e) else {
        return Ok(None);
    };
    let stored = store.hash_at(anchor.position).await?;
    Ok(Some(match stored {
        Some(h) if h != anchor.hash => Err(format!(
            "the anchor recorded at position {} names {anchor}, but the log's hash there is {}: the log before it was rewritten",
            e.position,
            llmgw_eventstore::hash::to_hex(&h[..6])
        )),
        stored => Ok(file::LogAnchor {
            anchor,
            event: e.position,
            recorded_at: e.recorded_at,
            checked: stored.is_some(),
        }),
    }))
}

/// A verification that found the log rewritten: why, as a line or as
/// the report with `field` set; exit 1.
fn tampered(
    report: &llmgw_eventstore::VerifyReport,
    json: bool,
    field: &str,
    why: &str,
) -> anyhow::Result<Outcome> {
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(report)?;
        value[field] = why.into();
        // One verdict a script reads, whatever failed: first_mismatch and
        // head_matches alone passed a rewritten log.
        value["ok"] = false.into();
        value["problem"] = why.into();
        json_line(&mut out, &value)?;
    } else {
        writeln!(out, "TAMPERED: {why}")?;
    }
    out.flush()?;
    Ok(Outcome::Failed)
}

async fn verify(
    store: &AnyStore,
    from: u64,
    to: Option<u64>,
    json: bool,
    held: Option<(PathBuf, anchors::Held)>,
) -> anyhow::Result<Outcome> {
    // As export and tail say: a --from 0 was taken as 1 here alone.
    if from == 0 {
        return Err(crate::config::ConfigError("positions start at 1".into()).into());
    }
    check_range(from, to, store.head().await?.0, "--to")?;
    let report = store.verify(from, to).await?;
    if let Some((path, held)) = &held {
        let mut out = std::io::stdout().lock();
        if let Some(why) = &held.problem {
            return tampered(&report, json, "anchors_problem", why);
        }
        if !json {
            // Without --public-key no signature was checked: "0 signed"
            // read as if the sink's signed lines were forged.
            let signed = if held.keyed {
                format!(" ({} signed by the key given)", held.proven)
            } else {
                " (signatures not checked: give --public-key)".to_owned()
            };
            writeln!(
                out,
                "{} anchors in {} match the log{signed}",
                held.matched,
                path.display(),
            )?;
        }
    }
    let anchor = if report.is_ok() {
        last_log_anchor(store, report.to).await?
    } else {
        None
    };
    if let Some(Err(why)) = &anchor {
        return tampered(&report, json, "anchor_problem", why);
    }
    let mut out = std::io::stdout().lock();
    let anchor = anchor.and_then(Result::ok);
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let Some((_, h)) = &held {
            value["anchors"] = serde_json::json!({"matched": h.matched, "proven": h.proven});
        }
        value["ok"] = report.is_ok().into();
        if let Some(p) = report.first_mismatch {
            value["problem"] = if report.missing {
                format!("position {p} is missing")
            } else {
                format!("position {p} does not match its hash")
            }
            .into();
        } else if report.head_matches == Some(false) {
            value["problem"] = "the log's recorded chain head differs".into();
        }
        if let Some(a) = &anchor {
            value["last_anchor"] = serde_json::json!({
                "anchor": a.anchor.to_string(),
                "event": a.event,
                "recorded_at": filter::when(a.recorded_at),
                "checked": a.checked,
            });
        }
        json_line(&mut out, &value)?;
    } else if report.checked == 0 && report.first_mismatch.is_none() {
        writeln!(out, "nothing to verify in {}..={}", report.from, report.to)?;
    } else if let Some(p) = report.first_mismatch {
        let what = if report.missing {
            "is missing: the log has no event there (a row was deleted)"
        } else {
            "does not match its hash"
        };
        writeln!(
            out,
            "TAMPERED: position {p} {what} ({} of {}..={} verified before it)",
            report.checked, report.from, report.to
        )?;
    } else if report.head_matches == Some(false) {
        writeln!(
            out,
            "TAMPERED: events {}..={} chain correctly, but the log's recorded chain head differs",
            report.from, report.to
        )?;
    } else {
        let (base, _) = store.base().await?;
        let trusted = if base > 0 && report.from == base + 1 {
            format!(
                " (the log begins after position {base}, at a hash taken on trust when it was imported)"
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "ok: {} events in {}..={} verified{trusted}",
            report.checked, report.from, report.to
        )?;
        if let Some(a) = &anchor {
            writeln!(out, "{}", log_anchor_line(a))?;
        }
    }
    out.flush()?;
    if !report.is_ok()
        && let Some(wal) = foreign_wal_suspect(store)
    {
        eprintln!(
            "note: {wal} lies beside it: a write-ahead log from another copy of this database (a crashed server's, with a backup copied over its file) gives this same picture. If the file was restored so, restore it again with the server stopped and {wal} and its -shm removed first (docs/operations.md, Backup and restore)"
        );
    }
    Ok(if report.is_ok() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}

/// The `-wal` file beside a SQLite store when it holds frames (more than
/// its 32-byte header): SQLite reads them over the file's pages whatever
/// copy of the database wrote them, so one left by another copy (a
/// crashed server's, a backup restored over its file with `cp`) shows as
/// rows missing or rewritten.
fn foreign_wal_suspect(store: &AnyStore) -> Option<String> {
    let llmgw_eventstore::StoreAddress::Sqlite(path) = store.address() else {
        return None;
    };
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    let frames = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 32);
    frames.then(|| wal.display().to_string())
}

async fn export(
    store: &AnyStore,
    from: u64,
    to: Option<u64>,
    output: Option<PathBuf>,
    sign_key: Option<PathBuf>,
) -> anyhow::Result<Outcome> {
    if from == 0 {
        return Err(crate::config::ConfigError("positions start at 1".into()).into());
    }
    // Read before anything is written: a bad key leaves no half file.
    let key = sign_key
        .map(|p| llmgw_eventstore::signing::SigningKey::read(&p))
        .transpose()?;
    let (head, _) = store.head().await?;
    check_range(from, to, head, "--to")?;
    let to = to.unwrap_or(head);
    let key = key.as_ref();
    let Some(path) = output else {
        let mut sink = BufWriter::new(std::io::stdout().lock());
        write_export(store, from, to, head, key, &mut sink).await?;
        return Ok(Outcome::Ok);
    };
    let done = export_file(store, from, to, head, key, &path).await?;
    eprintln!("exported {} events to {}", done.events, path.display());
    Ok(Outcome::Ok)
}

/// The events `from..=to` and the trailer into the file at `path`.
async fn export_file(
    store: &AnyStore,
    from: u64,
    to: u64,
    head: u64,
    key: Option<&llmgw_eventstore::signing::SigningKey>,
    path: &std::path::Path,
) -> anyhow::Result<llmgw_eventstore::Exported> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // A plain file (or none) is written aside and renamed once whole: a
    // file already at the path is kept until then, and a failure halfway
    // leaves no export without its trailer (which an import would take as
    // whole). A device (/dev/null), a pipe or a link is written through,
    // as any program would.
    let existing = std::fs::symlink_metadata(path).ok();
    let aside = existing.as_ref().is_none_or(|m| m.is_file()).then(|| {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".partial");
        PathBuf::from(aside)
    });
    let written = async {
        let file = match &aside {
            // The log holds tenancy data: a new export is its owner's
            // alone, and a replaced one keeps the mode it had.
            Some(aside) => {
                let mode = existing.map_or(0o600, |m| m.permissions().mode());
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(mode)
                    .open(aside)
                    .with_context(|| format!("cannot create {}", aside.display()))?;
                // The umask narrowed the mode at creation: set it outright.
                file.set_permissions(std::fs::Permissions::from_mode(mode))
                    .with_context(|| format!("cannot set the mode of {}", aside.display()))?;
                file
            }
            None => std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?,
        };
        let mut sink = BufWriter::with_capacity(1 << 20, file);
        let done = write_export(store, from, to, head, key, &mut sink).await?;
        if let Some(aside) = &aside {
            sink.into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .with_context(|| format!("cannot write {}", aside.display()))?;
            std::fs::rename(aside, path)
                .with_context(|| format!("cannot move the export into {}", path.display()))?;
        }
        anyhow::Ok(done)
    }
    .await;
    if written.is_err()
        && let Some(aside) = &aside
    {
        let _ = std::fs::remove_file(aside);
    }
    written
}

/// An end (`--to`, or `to_flag`) past the head, or before `--from`, is
/// refused (exit 2, a bad question, apart from verify's 1, a tampered
/// log): an auditor's "--to 500" on a log of 300 may mean the log was cut
/// short, and is said rather than quietly answered as far as the log
/// goes. A time resolves to a position at most the head, so only one
/// given outright can be past it.
pub(crate) fn check_range(
    from: u64,
    to: Option<u64>,
    head: u64,
    to_flag: &str,
) -> anyhow::Result<()> {
    let Some(to) = to else {
        // The position after the head is where the next events will be
        // (an export of what came since the last one, empty so far); one
        // further is a mistake, which gave an empty file and a pass.
        if from > head.saturating_add(1) {
            return Err(crate::config::ConfigError(format!(
                "--from {from} is past the log's head, position {head}"
            ))
            .into());
        }
        return Ok(());
    };
    let why = if to > head {
        format!("{to_flag} {to} is past the log's head, position {head}")
    } else if from > to {
        format!(
            "--from (position {from}) comes after {to_flag} (position {to}): give the earlier point first"
        )
    } else {
        return Ok(());
    };
    Err(crate::config::ConfigError(why).into())
}

/// The events `from..=to` and the trailer, to `sink`.
async fn write_export(
    store: &AnyStore,
    from: u64,
    to: u64,
    head: u64,
    key: Option<&llmgw_eventstore::signing::SigningKey>,
    mut sink: &mut dyn Write,
) -> anyhow::Result<llmgw_eventstore::Exported> {
    let done = llmgw_eventstore::export(store, from, Some(to), &mut sink).await?;
    let mut trailer = trailer(store, &done, head).await?;
    if let Some(key) = key {
        trailer.sign(key);
    }
    llmgw_eventstore::write_trailer(&mut sink, &trailer)?;
    sink.flush()?;
    Ok(done)
}

/// The trailer of an export that wrote `done` from a log whose head was
/// `head` when it began.
pub(crate) async fn trailer(
    store: &AnyStore,
    done: &llmgw_eventstore::Exported,
    head: u64,
) -> anyhow::Result<llmgw_eventstore::Trailer> {
    let head_hash = store.hash_at(head).await?.filter(|_| head > 0);
    let (base, _) = store.base().await?;
    let log_start = store.hash_at(base + 1).await?.map(|hash| {
        file::Anchor {
            position: base + 1,
            hash,
        }
        .to_string()
    });
    let (first, last) = done.positions.unwrap_or((0, 0));
    Ok(llmgw_eventstore::Trailer {
        format: 1,
        host: host(),
        log_start,
        from: first,
        to: last,
        events: done.events,
        last_hash: done.last_hash,
        head,
        head_hash,
        exported_at: chrono::Utc::now(),
        header_hash: None,
        signature: None,
    })
}

/// This machine's name, for the export's trailer.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

async fn stats(store: &AnyStore, json: bool) -> anyhow::Result<Outcome> {
    let stats = store.stats().await?;
    let (head, head_hash) = store.head().await?;
    let anchor = file::Anchor {
        position: head,
        hash: head_hash,
    };
    let (base, _) = store.base().await?;
    let mut out = std::io::stdout().lock();
    if json {
        let mut value = serde_json::to_value(&stats)?;
        if let serde_json::Value::Object(m) = &mut value {
            m.insert("chain_head".into(), anchor.to_string().into());
            m.insert("base".into(), base.into());
        }
        json_line(&mut out, &value)?;
    } else {
        writeln!(out, "events   {}", stats.count)?;
        writeln!(out, "head     {}", stats.head)?;
        writeln!(out, "streams  {}", stats.streams)?;
        if head > 0 {
            writeln!(out, "chain    {anchor}")?;
        }
        if base > 0 {
            writeln!(
                out,
                "begins   after position {base} (imported from an anchor taken on trust)"
            )?;
        }
        if !stats.by_type.is_empty() {
            writeln!(out)?;
            let mut t = Table::new(vec!["TYPE", "COUNT"]);
            for (kind, n) in &stats.by_type {
                t.row(vec![kind.clone(), n.to_string()]);
            }
            t.print(&mut out)?;
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}
