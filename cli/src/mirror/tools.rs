//! `mirror add`, `unused` and `remove`, run on the mirror's host against
//! its directory. `unused` and `remove` ask the control plane's catalog:
//! a file is in use when a model's source is `mirror:<m>/<v>/<file>` or
//! the byte path's URL of it (`--base`), or when the fleet's `engines:`
//! take their archives from its version; a version's `config.json` and
//! weight index are in use while any of its files is (`ctl plan --mirror`
//! sizes the model from them); an unreachable control plane is
//! never taken for an empty catalog.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use super::fetch::{Progress, fetch_version, locked_elsewhere};
use super::store::{MANIFEST, Manifest, Store, check_segments};
use crate::Outcome;
use crate::output::Table;

#[derive(Debug, clap::Args)]
pub(crate) struct AddArgs {
    /// The mirror's directory.
    #[arg(long)]
    dir: PathBuf,
    /// The model's name in the mirror.
    #[arg(long)]
    model: String,
    /// The version (a date, a revision): pinned, never overwritten.
    #[arg(long = "version", id = "model_version")]
    version: String,
    /// The file(s) to fetch: http(s) URLs or hf:org/repo[@revision]/file.
    #[arg(required = true)]
    sources: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct CatalogArgs {
    /// The control plane's admin API, whose catalog says what is in use
    /// (sent LLMGW_ADMIN_TOKEN where it has admin_token).
    #[arg(
        long,
        env = "LLMGW_ADMIN",
        default_value = "http://127.0.0.1:9090",
        value_parser = crate::admin_client::admin_url
    )]
    admin: String,
    /// The byte path's address as catalog entries name it (as `serve
    /// --base`), so that URL sources count as well as mirror: ones.
    #[arg(long)]
    base: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct UnusedArgs {
    /// The mirror's directory.
    #[arg(long)]
    dir: PathBuf,
    #[command(flatten)]
    catalog: CatalogArgs,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RemoveArgs {
    /// The mirror's directory.
    #[arg(long)]
    dir: PathBuf,
    /// The model.
    #[arg(long)]
    model: String,
    /// The version.
    #[arg(long = "version", id = "model_version")]
    version: String,
    /// The file.
    #[arg(long)]
    file: String,
    #[command(flatten)]
    catalog: CatalogArgs,
    /// Delete without asking the control plane whether it is in use.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// The mirror's directory.
    #[arg(long)]
    dir: PathBuf,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// What the directory holds, read from the directory itself (the host's
/// view, as `add` and `remove` take it): a fetch under way in a serving
/// process shows as fetching, with the bytes that have arrived.
pub(crate) fn list(a: ListArgs) -> anyhow::Result<Outcome> {
    if !a.dir.is_dir() {
        anyhow::bail!("{} is not a directory", a.dir.display());
    }
    let entries = Store::new(a.dir).list(&|_, _| None);
    let mut out = std::io::stdout().lock();
    if a.json {
        crate::output::json_line(&mut out, &entries)?;
        return Ok(Outcome::Ok);
    }
    if entries.is_empty() {
        eprintln!("nothing held yet: llmgw mirror add fetches a version");
        return Ok(Outcome::Ok);
    }
    let mut t =
        // The last column: a file's checksum, or why a fetch failed.
        crate::output::Table::new(vec!["MODEL", "VERSION", "STATE", "FILE", "BYTES", "SHA256/WHY"]);
    for e in entries {
        let (model, version, state) = (e.model, e.version, e.state.to_owned());
        if e.files.is_empty() {
            let bytes = match (e.bytes_done, e.bytes_total) {
                (Some(done), Some(total)) if total > 0 => format!("{done} of {total}"),
                (Some(done), _) => done.to_string(),
                _ => "-".into(),
            };
            let why = e.reason.unwrap_or_else(|| "-".into());
            t.row(vec![model, version, state, "-".into(), bytes, why]);
            continue;
        }
        for f in e.files {
            t.row(vec![
                model.clone(),
                version.clone(),
                state.clone(),
                f.name,
                f.size.to_string(),
                f.sha256.unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    t.print(&mut out)?;
    Ok(Outcome::Ok)
}

pub(crate) async fn add(a: AddArgs) -> anyhow::Result<Outcome> {
    check_segments(&[a.model.as_str(), a.version.as_str()]).map_err(anyhow::Error::msg)?;
    let store = Store::new(a.dir.clone());
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let http = reqwest::Client::new();
    let progress = Arc::new(Progress::default());
    let fetch = fetch_version(&store, &http, &a.model, &a.version, &a.sources, &progress);
    tokio::pin!(fetch);
    // A large file takes a while: say how far it has got now and then.
    let mut every = tokio::time::interval(Duration::from_secs(10));
    every.tick().await;
    let manifest = loop {
        tokio::select! {
            r = &mut fetch => break r.map_err(anyhow::Error::msg)?,
            _ = every.tick() => {
                let done = progress.done.load(std::sync::atomic::Ordering::Relaxed);
                let total = progress.total.load(std::sync::atomic::Ordering::Relaxed);
                match (done * 100).checked_div(total) {
                    Some(pct) => eprintln!("{done} of {total} bytes ({pct}%)"),
                    None => eprintln!("{done} bytes"),
                }
            }
        }
    };
    let mut out = std::io::stdout().lock();
    for f in &manifest.files {
        writeln!(
            out,
            "{}  {}/{}/{}",
            f.sha256.as_deref().unwrap_or("-"),
            a.model,
            a.version,
            f.name
        )?;
    }
    if !manifest.upstream_verified {
        writeln!(
            out,
            "the upstream publishes no sha256 for this: compare the sums above with what it says"
        )?;
    }
    for f in &manifest.files {
        writeln!(out, "source: mirror:{}/{}/{}", a.model, a.version, f.name)?;
    }
    Ok(Outcome::Ok)
}

/// What the control plane uses of a mirror: its catalog's sources, and
/// the whole versions its engine builds come from (`engines:` with a
/// `mirror:` source names a version, every archive of which may be
/// installed on some node).
struct InUse {
    sources: Vec<String>,
    versions: Vec<String>,
}

/// Reads what is in use from the control plane; an error when it cannot
/// be read (then nothing can be called unused).
async fn in_use_by(c: &CatalogArgs) -> anyhow::Result<InUse> {
    let http = reqwest::Client::builder()
        .default_headers(crate::admin_client::token_headers()?)
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()?;
    let read = |what: &'static str, path: &'static str| {
        let url = format!("{}{path}", c.admin.trim_end_matches('/'));
        let http = http.clone();
        async move {
            let resp = http.get(&url).send().await.with_context(|| {
                format!(
                    "cannot reach the control plane at {} to read the {what}, so nothing can be called unused",
                    c.admin
                )
            })?;
            if !resp.status().is_success() {
                bail!(
                    "the control plane at {} answered {} for the {what} (router-only?), so nothing can be called unused",
                    c.admin,
                    resp.status()
                );
            }
            let rows: Vec<serde_json::Value> = resp
                .json()
                .await
                .with_context(|| format!("reading the {what}"))?;
            Ok(rows)
        }
    };
    let sources = read("catalog", "/api/v1/models")
        .await?
        .iter()
        .filter_map(|r| r["source"].as_str().map(str::to_owned))
        .filter(|s| !s.is_empty())
        .collect();
    // A manifest's address ends with the version's <model>/<version>.
    let versions = read("engines", "/api/v1/engines")
        .await?
        .iter()
        .filter_map(|r| r["manifest"].as_str())
        .filter_map(|m| {
            let mut parts = m.trim_end_matches('/').rsplitn(3, '/');
            let (v, model) = (parts.next()?, parts.next()?);
            Some(format!("{model}/{v}"))
        })
        .collect();
    Ok(InUse { sources, versions })
}

/// The files a version's weights are sized from (`ctl plan --mirror`
/// reads them): in use whenever any file of their version is.
const SIZING: [&str; 2] = ["config.json", "model.safetensors.index.json"];

fn in_use(used: &InUse, base: Option<&str>, m: &str, v: &str, f: &str) -> bool {
    let version = format!("{m}/{v}");
    used.versions.contains(&version)
        || used
            .sources
            .iter()
            .filter_map(|s| file_of(s, base, &version))
            .any(|named| named == f || SIZING.contains(&f))
}

/// The file of `version` (`<model>/<version>`) that a catalog source names,
/// as `mirror:` or as the byte path's URL under `base`.
fn file_of<'a>(source: &'a str, base: Option<&str>, version: &str) -> Option<&'a str> {
    let tail = source.strip_prefix("mirror:").or_else(|| {
        source
            .strip_prefix(base?.trim_end_matches('/'))?
            .strip_prefix('/')
    })?;
    tail.strip_prefix(version)?.strip_prefix('/')
}

pub(crate) async fn unused(a: UnusedArgs) -> anyhow::Result<Outcome> {
    let sources = in_use_by(&a.catalog).await?;
    let store = Store::new(a.dir.clone());
    let mut rows = Vec::new();
    for e in store.list(&|_, _| None) {
        if e.state != "present" {
            continue;
        }
        for f in &e.files {
            if !in_use(
                &sources,
                a.catalog.base.as_deref(),
                &e.model,
                &e.version,
                &f.name,
            ) {
                rows.push(serde_json::json!({
                    "model": e.model, "version": e.version, "file": f.name, "size": f.size,
                }));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        let mut t = Table::new(vec!["MODEL", "VERSION", "FILE", "BYTES"]);
        for r in &rows {
            t.row(vec![
                r["model"].as_str().unwrap_or_default().to_owned(),
                r["version"].as_str().unwrap_or_default().to_owned(),
                r["file"].as_str().unwrap_or_default().to_owned(),
                r["size"].to_string(),
            ]);
        }
        t.print(&mut out)?;
    }
    Ok(Outcome::Ok)
}

pub(crate) async fn remove(a: RemoveArgs) -> anyhow::Result<Outcome> {
    let (m, v, f) = (&a.model, &a.version, &a.file);
    check_segments(&[m.as_str(), v.as_str(), f.as_str()]).map_err(anyhow::Error::msg)?;
    let store = Store::new(a.dir.clone());
    let Some((path, _)) = store.held_file(m, v, f) else {
        bail!("the mirror holds no {m}/{v}/{f}");
    };
    if locked_elsewhere(&store.lock_path(m, v)) {
        bail!("{m}/{v} is being fetched; remove it once the fetch has ended");
    }
    if !a.force {
        let sources = in_use_by(&a.catalog)
            .await
            .context("(--force removes it without asking)")?;
        if in_use(&sources, a.catalog.base.as_deref(), m, v, f) {
            let why = if SIZING.contains(&f.as_str()) {
                " (ctl plan --mirror sizes the model from it while any file of its version is in the catalog)"
            } else {
                ""
            };
            bail!(
                "{m}/{v}/{f} is in use by the catalog or the fleet's engines{why}: retire the entry (or change engines:) first, let the fleet settle, then remove (or --force)"
            );
        }
    }
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    // The manifest forgets it; a version left with no file goes whole.
    let dir = store.version_dir(m, v);
    if store.held(m, v).is_some_and(|files| files.is_empty()) {
        store
            .remove_version(m, v)
            .with_context(|| format!("removing {}", dir.display()))?;
    } else if let Some(mut mf) = store.manifest(m, v) {
        mf.files.retain(|e| e.name != *f);
        write_manifest(&dir, &mf)?;
    }
    println!("removed {m}/{v}/{f}");
    Ok(Outcome::Ok)
}

fn write_manifest(dir: &std::path::Path, mf: &Manifest) -> anyhow::Result<()> {
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(mf)?)?;
    std::fs::rename(&tmp, dir.join(MANIFEST))?;
    Ok(())
}
