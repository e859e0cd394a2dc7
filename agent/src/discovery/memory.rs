//! Total RAM from `/proc/meminfo`, in MiB. 0 means unknown, which places no
//! constraint, rather than a machine with no memory.

use std::path::Path;

pub fn total_mb(meminfo: &Path) -> u64 {
    std::fs::read_to_string(meminfo).map_or(0, |t| parse(&t))
}

pub fn parse(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}
