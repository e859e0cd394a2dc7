//! `llmgw ctl plan M`: whether a model fits each GPU class of the fleet,
//! the smallest tensor- (then pipeline-) parallel split that does, and the
//! catalog profile that matches it. The weights' shape comes from a local
//! copy's `config.json` and `model.safetensors.index.json`, or the same
//! files of the mirror's version for a `mirror:` source (never from the
//! internet); the classes from the nodes the control plane knows; the
//! arithmetic from `llmgw_domain::sizing`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use llmgw_api::admin as api;
use llmgw_domain::sizing::{self, Dtype, GpuClass, Headroom, ModelShape, Split};
use serde_json::{Value, json};

use crate::Outcome;
use crate::cluster::Admin;
use crate::output::{Table, json_line};

#[derive(Debug, clap::Args)]
pub(crate) struct PlanArgs {
    /// A model: a catalog name or alias (its source is read when it is a
    /// local path), or any name with --path.
    model: String,
    /// A local directory holding the model's config.json and, for an
    /// exact parameter count, model.safetensors.index.json.
    #[arg(long)]
    path: Option<PathBuf>,
    /// The model mirror's byte path (its `serve --base`): a catalog source
    /// mirror:<model>/<version>/<file> is read from that version's
    /// config.json and index there.
    #[arg(long, env = "LLMGW_MIRROR")]
    mirror: Option<String>,
    /// The format the engine holds the weights in: bf16, fp16, fp8, int8,
    /// int4 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    /// Tokens of KV cache that must fit beside the weights, all requests
    /// together.
    #[arg(long, default_value_t = 8192)]
    kv_tokens: u64,
    /// The share of each card the engine may use (vLLM's
    /// gpu_memory_utilization).
    #[arg(long, default_value_t = 0.9)]
    utilization: f64,
}

/// The classes the fleet has: each with its smallest card, the most cards
/// one node has, and how many nodes have it.
fn fleet(nodes: &[api::NodeRow]) -> Vec<GpuClass> {
    let mut by: BTreeMap<&str, GpuClass> = BTreeMap::new();
    for n in nodes {
        for g in &n.gpu_classes {
            let c = by.entry(g.class.as_str()).or_insert_with(|| GpuClass {
                class: g.class.clone(),
                memory_mb: g.memory_mb,
                per_node: 0,
                nodes: 0,
            });
            c.memory_mb = c.memory_mb.min(g.memory_mb);
            c.per_node = c.per_node.max(g.count);
            c.nodes += 1;
        }
    }
    by.into_values().collect()
}

/// Where the model's config.json and index are read.
#[derive(Debug)]
enum Origin {
    Dir(PathBuf),
    /// A version's URL on the mirror's byte path.
    Mirror(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Dir(d) => write!(f, "{}", d.display()),
            Origin::Mirror(u) => f.write_str(u),
        }
    }
}

/// The directory to read: --path, else the catalog's source when it is a
/// path on this machine or a file the mirror holds.
fn model_dir(args: &PlanArgs, row: Option<&api::ModelRow>) -> anyhow::Result<Origin> {
    if let Some(p) = &args.path {
        return Ok(Origin::Dir(p.clone()));
    }
    let Some(row) = row else {
        bail!(
            "{} is not in the catalog: give --path DIR (a directory with its config.json)",
            args.model
        );
    };
    if let Some(rest) = row.source.strip_prefix("mirror:") {
        let Some((version, _file)) = rest.rsplit_once('/') else {
            bail!("{}'s source {:?} names no file", row.name, row.source);
        };
        let Some(base) = &args.mirror else {
            bail!(
                "{}'s source {} is on the mirror: give --mirror URL (the mirror's --base)",
                row.name,
                row.source
            );
        };
        return Ok(Origin::Mirror(format!(
            "{}/{version}",
            base.trim_end_matches('/')
        )));
    }
    let source = row.source.strip_prefix("file://").unwrap_or(&row.source);
    if source.starts_with('/') && Path::new(source).exists() {
        return Ok(Origin::Dir(source.into()));
    }
    bail!(
        "{}'s source {:?} is not a path on this machine (nor a mirror: file): give --path DIR (a directory with its config.json); plan reads nothing from the internet",
        row.name,
        row.source
    )
}

/// One JSON file of the model; None when it is not there.
async fn read_json(origin: &Origin, name: &str) -> anyhow::Result<Option<Value>> {
    let text = match origin {
        Origin::Dir(dir) => {
            let p = dir.join(name);
            match std::fs::read_to_string(&p) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e).with_context(|| format!("cannot read {}", p.display())),
            }
        }
        Origin::Mirror(version) => {
            let url = format!("{version}/{name}");
            let resp = reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .no_proxy()
                .build()?
                .get(&url)
                .send()
                .await
                .with_context(|| format!("cannot reach the mirror at {url}"))?;
            if resp.status() == reqwest::StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !resp.status().is_success() {
                bail!("{url} answered {}", resp.status());
            }
            resp.text()
                .await
                .with_context(|| format!("reading {url}"))?
        }
    };
    Ok(Some(
        serde_json::from_str(&text).with_context(|| format!("{origin}/{name} is not JSON"))?,
    ))
}

async fn read_shape(origin: &Origin) -> anyhow::Result<ModelShape> {
    let config = read_json(origin, "config.json").await?.with_context(|| {
        format!("{origin} has no config.json (a GGUF file's shape is not read by plan)")
    })?;
    let index_bytes = read_json(origin, "model.safetensors.index.json")
        .await?
        .and_then(|i| i.pointer("/metadata/total_size").and_then(Value::as_u64));
    Ok(ModelShape::from_config(&config, index_bytes)?)
}

fn gib(mb: u64) -> String {
    format!("{:.1} GiB", mb as f64 / 1024.0)
}

/// What the catalog offers for a class: its profile that fits with the
/// fewest cards, else its profiles for the class that do not.
fn catalog_verdict(
    shape: &ModelShape,
    dtype: Dtype,
    class: &GpuClass,
    room: &Headroom,
    row: Option<&api::ModelRow>,
) -> (Option<String>, Vec<String>) {
    let mut fitting: Vec<(u32, String)> = Vec::new();
    let mut not = Vec::new();
    for p in row.iter().flat_map(|r| &r.shapes) {
        if p.gpu_class.as_deref() != Some(class.class.as_str()) {
            continue;
        }
        let s = sizing::check(shape, dtype, class, room, p.tp.max(1), p.pp.max(1));
        if s.fits {
            fitting.push((p.tp.max(1) * p.pp.max(1), p.name.clone()));
        } else {
            not.push(p.name.clone());
        }
    }
    fitting.sort();
    (fitting.into_iter().next().map(|(_, n)| n), not)
}

pub(crate) async fn run(admin: &str, json_out: bool, args: PlanArgs) -> anyhow::Result<Outcome> {
    // Exit 2, apart from 1, which says the model fits no class.
    let bad = |why: String| anyhow::Error::new(crate::config::ConfigError(why));
    if !(args.utilization > 0.0 && args.utilization <= 1.0) {
        return Err(bad("--utilization must be above 0 and at most 1".into()));
    }
    let dtype = args
        .dtype
        .as_deref()
        .map(|d| {
            Dtype::parse(d)
                .ok_or_else(|| bad(format!("--dtype {d:?}: use bf16, fp16, fp8, int8 or int4")))
        })
        .transpose()?;
    // Said before the cluster is asked: a typo in --path is not a server
    // that cannot be reached.
    if let Some(p) = &args.path
        && !p.is_dir()
    {
        return Err(bad(format!(
            "--path {}: no such directory (give the model's directory, with its config.json)",
            p.display()
        )));
    }
    let a = Admin::new(admin)?;
    let models: Vec<api::ModelRow> = a.get("/api/v1/models").await?;
    let row = models
        .iter()
        .find(|m| m.name == args.model || m.aliases.contains(&args.model));
    let dir = model_dir(&args, row)?;
    let shape = read_shape(&dir).await?;
    let dtype = dtype.unwrap_or(shape.dtype);
    let nodes: Vec<api::NodeRow> = a.get("/api/v1/nodes").await?;
    let classes = fleet(&nodes);
    let room = Headroom {
        utilization: args.utilization,
        kv_tokens: args.kv_tokens,
        ..Headroom::default()
    };
    let plans: Vec<(GpuClass, Option<Split>)> = classes
        .into_iter()
        .map(|c| {
            let s = sizing::smallest_split(&shape, dtype, &c, &room);
            (c, s)
        })
        .collect();
    let weights = shape.weight_bytes(dtype);
    let kv_token = shape.kv_bytes_per_token(room.kv_dtype, 1, 1);
    let any_fits = plans.iter().any(|(_, s)| s.is_some());
    let mut out = std::io::stdout().lock();
    if json_out {
        let classes: Vec<Value> = plans
            .iter()
            .map(|(c, s)| {
                let (profile, too_small) = catalog_verdict(&shape, dtype, c, &room, row);
                json!({
                    "class": c.class, "memory_mb": c.memory_mb, "per_node": c.per_node, "nodes": c.nodes,
                    "split": s.as_ref().map(|s| json!({"tp": s.tp, "pp": s.pp, "needed_mb": s.needed_mb,
                        "usable_mb": s.usable_mb, "kv_tokens": s.kv_tokens})),
                    "catalog_profile": profile,
                    "catalog_profiles_too_small": too_small,
                    "suggested_profile": s.as_ref().filter(|_| profile.is_none()).map(|s| suggested(c, s)),
                })
            })
            .collect();
        json_line(
            &mut out,
            &json!({
                  "model": args.model, "path": dir.to_string(), "params": shape.params, "params_exact": shape.params_exact,
                "dtype": dtype.name(), "weights_bytes": weights, "kv_bytes_per_token": kv_token,
                "kv_tokens": room.kv_tokens, "utilization": room.utilization, "classes": classes,
            }),
        )?;
    } else {
        writeln!(
            out,
            "model    {}: {:.1} B parameters ({}), {} → {} of weights",
            args.model,
            shape.params as f64 / 1e9,
            if shape.params_exact {
                "from the weight index"
            } else {
                "estimated from config.json"
            },
            dtype.name(),
            gib(weights.div_ceil(1 << 20)),
        )?;
        writeln!(
            out,
            "kv cache {} KiB a token ({} layers, {} KV heads); {} tokens must fit, {:.0}% of each card used",
            kv_token / 1024,
            shape.layers,
            shape.kv_heads,
            room.kv_tokens,
            room.utilization * 100.0
        )?;
        if plans.is_empty() {
            writeln!(out, "the control plane knows no GPU node to plan for")?;
        }
        let mut t = Table::new(vec![
            "CLASS",
            "CARD",
            "CARDS/NODE",
            "NODES",
            "SPLIT",
            "PER CARD",
            "KV TOKENS",
            "PROFILE",
        ]);
        for (c, s) in &plans {
            let (profile, too_small) = catalog_verdict(&shape, dtype, c, &room, row);
            let (split, per, kv) = match s {
                Some(s) => (
                    format!("tp={} pp={}", s.tp, s.pp),
                    format!("{} of {}", gib(s.needed_mb), gib(s.usable_mb)),
                    s.kv_tokens.to_string(),
                ),
                None => ("does not fit".into(), "-".into(), "-".into()),
            };
            let profile = match (profile, s) {
                (Some(p), _) => format!("{p} (catalog)"),
                (None, Some(s)) => format!("new: {}", suggested(c, s)),
                (None, None) => "-".into(),
            };
            let profile = if too_small.is_empty() {
                profile
            } else {
                format!("{profile}; too small: {}", too_small.join(","))
            };
            t.row(vec![
                c.class.clone(),
                gib(c.memory_mb),
                c.per_node.to_string(),
                c.nodes.to_string(),
                split,
                per,
                kv,
                profile,
            ]);
        }
        t.print(&mut out)?;
    }
    Ok(if any_fits {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}

/// A catalog profile for the split, as `models[].profiles[]` spells it.
fn suggested(c: &GpuClass, s: &Split) -> String {
    format!(
        "{{gpu_class: {}, tp: {}, pp: {}, nodes: {}, gpus_per_node: {}}}",
        c.class, s.tp, s.pp, s.pp, s.tp
    )
}
