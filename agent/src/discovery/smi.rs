//! GPUs through `nvidia-smi`'s CSV query.

use crate::secrets::WithoutSecrets;
use std::path::Path;
use std::process::Command;

use crate::discovery::gpu::{Gpu, Health};

/// Fields requested, in order. `utilization.gpu` is last because older
/// drivers leave it out, and the columns before it still line up.
pub const QUERY: &str = "index,uuid,name,memory.total,memory.used,compute_cap,pci.bus_id,driver_version,temperature.gpu,ecc.errors.uncorrected.volatile.total,utilization.gpu";

/// Rows with fewer fields than this are not GPUs we can use.
const MANDATORY_FIELDS: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum SmiError {
    #[error("running {bin}: {source}")]
    Run {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    /// `said`: what it printed (its stderr, else its stdout, where
    /// nvidia-smi writes why it failed), bounded.
    #[error("running {bin}: {status}: {said}")]
    Failed {
        bin: String,
        status: String,
        said: String,
    },
    #[error("parsing nvidia-smi output: {0}")]
    Parse(String),
}

/// Runs nvidia-smi and parses its answer. With no explicit binary and no
/// `nvidia-smi` on PATH this is a CPU node: no GPUs, and no error.
pub fn discover(bin: Option<&Path>) -> Result<Vec<Gpu>, SmiError> {
    let program = match bin {
        Some(b) => b.to_path_buf(),
        None => match find_on_path("nvidia-smi") {
            Some(p) => p,
            None => return Ok(Vec::new()),
        },
    };
    let shown = program.display().to_string();
    let out = Command::new(&program)
        .envs_without_secrets()
        .arg(format!("--query-gpu={QUERY}"))
        .arg("--format=csv,noheader,nounits")
        .output()
        .map_err(|source| SmiError::Run {
            bin: shown.clone(),
            source,
        })?;
    if !out.status.success() {
        // nvidia-smi says why on stdout ("NVIDIA-SMI has failed because
        // it couldn't communicate with the NVIDIA driver..."), and leaves
        // stderr empty.
        let said = [&out.stderr, &out.stdout]
            .into_iter()
            .map(|o| excerpt(&String::from_utf8_lossy(o)))
            .find(|s| !s.is_empty())
            .unwrap_or_else(|| "it printed nothing".into());
        return Err(SmiError::Failed {
            bin: shown,
            status: out.status.to_string(),
            said,
        });
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// The most of what a command printed that an error carries.
const EXCERPT_CHARS: usize = 300;

/// `text` as one line for an error (and, through the GPUs' problems, the
/// event log): its lines trimmed and joined with "; ", cut to
/// [`EXCERPT_CHARS`].
pub fn excerpt(text: &str) -> String {
    let joined = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    match joined.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &joined[..cut]),
        None => joined,
    }
}

fn find_on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// A number from a CSV cell: units stripped; `[N/A]`, `Not Supported`, an
/// empty cell or garbage all read as 0.
pub fn parse_csv_int(s: &str) -> u64 {
    let s = s.trim();
    let s = s.strip_suffix(" MiB").unwrap_or(s);
    let s = s.strip_suffix(" W").unwrap_or(s);
    if s.is_empty() || s.starts_with('[') || s.eq_ignore_ascii_case("not supported") {
        return 0;
    }
    s.parse().unwrap_or(0)
}

/// The rows of `--format=csv,noheader,nounits` output.
pub fn parse(text: &str) -> Result<Vec<Gpu>, SmiError> {
    let mut gpus = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields = split_csv(line)?;
        if fields.len() < MANDATORY_FIELDS {
            continue;
        }
        let Ok(index) = fields[0].parse::<u32>() else {
            continue;
        };
        let gpu = Gpu {
            index,
            uuid: fields[1].clone(),
            name: fields[2].clone(),
            memory_total_mb: parse_csv_int(&fields[3]),
            memory_used_mb: parse_csv_int(&fields[4]),
            compute_capability: fields[5].clone(),
            pci_bus_id: fields[6].clone(),
            driver_version: fields[7].clone(),
            health: Health {
                temperature_c: parse_csv_int(&fields[8]),
                ecc_errors: parse_csv_int(&fields[9]),
                ..Health::default()
            },
            utilization_percent: fields.get(10).map_or(0, |u| parse_csv_int(u)),
            numa_node: -1,
            ..Gpu::default()
        };
        gpus.push(gpu.finish());
    }
    Ok(gpus)
}

/// One CSV line: fields trimmed, double quotes honoured.
fn split_csv(line: &str) -> Result<Vec<String>, SmiError> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' if quoted => quoted = false,
            '"' if cur.trim().is_empty() => {
                cur.clear();
                quoted = true;
            }
            ',' if !quoted => fields.push(std::mem::take(&mut cur).trim().to_owned()),
            c => cur.push(c),
        }
    }
    if quoted {
        return Err(SmiError::Parse(format!("unterminated quote in {line:?}")));
    }
    fields.push(cur.trim().to_owned());
    Ok(fields)
}
