//! GPUs through `nvidia-smi`'s CSV query.

use crate::secrets::WithoutSecrets;
use std::path::Path;
use std::process::Command;

use crate::discovery::gpu::{Gpu, Health};

/// Fields requested, in order. `utilization.gpu` is last because older
/// drivers leave it out, and the columns before it still line up.
pub const QUERY: &str = "index,uuid,name,memory.total,memory.used,compute_cap,pci.bus_id,driver_version,temperature.gpu,ecc.errors.uncorrected.volatile.total,utilization.gpu";

/// [`QUERY`]'s fields, by column.
const FIELDS: [&str; 11] = [
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "compute_cap",
    "pci.bus_id",
    "driver_version",
    "temperature.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "utilization.gpu",
];

/// A card's row has at least these (all but `utilization.gpu`).
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

/// A figure a card may lack, from a CSV cell: units stripped; `[N/A]`,
/// `Not Supported`, an empty cell or anything else that is no number
/// reads as 0, as NVML's discovery leaves a figure it cannot read (ECC on
/// a card without it, a temperature the driver does not give).
pub fn parse_csv_int(s: &str) -> u64 {
    parse_mib(s).unwrap_or(0)
}

/// A number from a CSV cell, units stripped; None when the cell holds
/// none (`[Insufficient Permissions]`, `[Unknown Error]`, `[N/A]`).
pub fn parse_mib(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix(" MiB").unwrap_or(s);
    let s = s.strip_suffix(" W").unwrap_or(s);
    s.parse().ok()
}

/// What nvidia-smi prints, with success, on a machine whose driver sees
/// no card.
const NO_DEVICES: &str = "No devices were found";

/// The rows of `--format=csv,noheader,nounits` output, one card each.
///
/// Memory is what a card's class and health are made of: a card whose
/// memory.total or memory.used is no number is kept with `memory
/// unreadable: …` as a problem (out of placement), as NVML's discovery
/// keeps it. Output with no card's row in it is an error that quotes it
/// (a driver's complaint printed with success is not "no GPUs"), and so
/// is a card's row with fewer fields than asked for. Other lines beside
/// the rows (a driver's warning) are logged and left.
pub fn parse(text: &str) -> Result<Vec<Gpu>, SmiError> {
    let mut gpus = Vec::new();
    let mut other = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields = split_csv(line)?;
        let Ok(index) = fields[0].parse::<u32>() else {
            other.push(line.trim());
            continue;
        };
        if fields.len() < MANDATORY_FIELDS {
            return Err(SmiError::Parse(format!(
                "the row of GPU {index} has {} of the {MANDATORY_FIELDS} fields asked for: {}",
                fields.len(),
                excerpt(line)
            )));
        }
        let memory = |i: usize| parse_mib(&fields[i]).ok_or(i);
        let (memory_total, memory_used) = (memory(3), memory(4));
        let unreadable: Vec<String> = [&memory_total, &memory_used]
            .into_iter()
            .filter_map(|m| m.err())
            .map(|i| format!("{} {}", FIELDS[i], fields[i]))
            .collect();
        let gpu = Gpu {
            index,
            uuid: fields[1].clone(),
            name: fields[2].clone(),
            memory_total_mb: memory_total.unwrap_or(0),
            memory_used_mb: memory_used.unwrap_or(0),
            compute_capability: fields[5].clone(),
            pci_bus_id: fields[6].clone(),
            driver_version: fields[7].clone(),
            health: Health {
                temperature_c: parse_csv_int(&fields[8]),
                ecc_errors: parse_csv_int(&fields[9]),
                unreadable: if unreadable.is_empty() {
                    Vec::new()
                } else {
                    vec![format!("memory unreadable: {}", unreadable.join(", "))]
                },
                ..Health::default()
            },
            utilization_percent: fields.get(10).map_or(0, |u| parse_csv_int(u)),
            numa_node: -1,
            ..Gpu::default()
        };
        gpus.push(gpu.finish());
    }
    if gpus.is_empty() && !other.is_empty() {
        if other == [NO_DEVICES] {
            return Ok(gpus);
        }
        return Err(SmiError::Parse(format!(
            "no GPU's row in what it printed: {}",
            excerpt(&other.join("\n"))
        )));
    }
    for line in other {
        tracing::warn!(line = %excerpt(line), "nvidia-smi printed a line that is no GPU's row");
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

    use super::{FIELDS, QUERY, SmiError, parse};

    const ROW: &str =
        "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 4, 9.0, 00000000:1B:00.0, 550.54.15, 34, 0, 0";

    #[test]
    fn the_fields_named_are_the_fields_asked_for() {
        assert_eq!(FIELDS.join(","), QUERY);
    }

    /// A field the driver cannot read was 0: class `h100-0g`, counted
    /// free and healthy. It is now the card's problem, as NVML words it.
    #[test]
    fn memory_that_is_no_number_keeps_the_card_out() {
        for (total, used, says) in [
            (
                "[Insufficient Permissions]",
                "4",
                "memory unreadable: memory.total [Insufficient Permissions]",
            ),
            (
                "81559",
                "[Unknown Error]",
                "memory unreadable: memory.used [Unknown Error]",
            ),
            (
                "[N/A]",
                "[N/A]",
                "memory unreadable: memory.total [N/A], memory.used [N/A]",
            ),
        ] {
            let row = ROW.replacen("81559, 4,", &format!("{total}, {used},"), 1);
            let gpus = parse(&row).unwrap();
            assert_eq!(gpus.len(), 1, "the card is kept: {row}");
            let g = &gpus[0];
            assert_eq!(g.health.problems, [says], "{row}");
            assert!(!g.health.ok());
            assert_eq!(g.problems_given(true), [says], "ours or not, it stays out");
        }
        let g = &parse(&ROW.replace("81559, 4,", "81559 MiB, 4 MiB,")).unwrap()[0];
        assert!(g.health.ok() && g.class == "h100-80g", "{g:?}");
    }

    /// Figures a card may lack read as 0, as NVML's discovery leaves them.
    #[test]
    fn temperature_ecc_and_utilisation_a_card_lacks_are_no_problem() {
        for cell in [
            "[N/A]",
            "Not Supported",
            "[Not Supported]",
            "",
            "[Unknown Error]",
        ] {
            let row = ROW.replace(
                "550.54.15, 34, 0, 0",
                &format!("550.54.15, {cell}, {cell}, {cell}"),
            );
            let g = &parse(&row).unwrap()[0];
            assert!(g.health.ok(), "{cell:?}: {:?}", g.health);
            assert_eq!(
                (
                    g.health.temperature_c,
                    g.health.ecc_errors,
                    g.utilization_percent
                ),
                (0, 0, 0)
            );
        }
    }

    /// A driver's complaint printed with success was read as "no GPUs"
    /// (a CPU node): it is an error that quotes it.
    #[test]
    fn output_without_a_gpus_row_is_an_error_that_quotes_it() {
        let err =
            parse("Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error\n")
                .unwrap_err();
        assert!(matches!(err, SmiError::Parse(_)));
        assert_eq!(
            err.to_string(),
            "parsing nvidia-smi output: no GPU's row in what it printed: Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error"
        );
        // A header (the CSV asked for without noheader) is no row either.
        assert!(parse(&format!("{}\n", FIELDS.join(", "))).is_err());
        // What says "none here" is none, and so is nothing at all.
        assert!(parse("No devices were found\n").unwrap().is_empty());
        assert!(parse("").unwrap().is_empty());
        assert!(parse("\n  \n").unwrap().is_empty());
    }

    /// A card's row cut short was skipped, and the card with it.
    #[test]
    fn a_gpus_row_with_fields_missing_is_an_error() {
        let err = parse(&format!("{ROW}\n1, GPU-short, NVIDIA H100\n"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "parsing nvidia-smi output: the row of GPU 1 has 3 of the 10 fields asked for: 1, GPU-short, NVIDIA H100"
        );
    }

    /// A warning beside the rows (an infoROM the driver distrusts) leaves
    /// the cards as they are.
    #[test]
    fn a_line_beside_the_rows_leaves_them() {
        let text = format!("WARNING: infoROM is corrupted at gpu 0000:1B:00.0\n{ROW}\n");
        let gpus = parse(&text).unwrap();
        assert_eq!(gpus.len(), 1);
        assert!(gpus[0].health.ok());
    }
}
