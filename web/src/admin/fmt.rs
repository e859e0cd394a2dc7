//! How numbers, money and times read on the admin pages.

use chrono::{DateTime, Utc};

/// `1234567` → `1,234,567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Micro-units as units with four decimals, rounded (prices are
/// micro-units per 1,000 tokens, so a single request's cost is often below
/// a cent); a spend too small to show is `<0.0001`, not nothing.
pub(crate) fn money(micros: u64) -> String {
    if (1..50).contains(&micros) {
        return "<0.0001".into();
    }
    let tenths_of_a_mil = micros.saturating_add(50) / 100;
    let whole = tenths_of_a_mil / 10_000;
    let frac = tenths_of_a_mil % 10_000;
    format!("{}.{frac:04}", count(whole))
}

/// Micro-units as units to the micro-unit, nothing rounded:
/// `1234567890` → `1,234.567890`. For a table whose rows add up to its
/// total: rounded rows need not add up to the rounded total.
pub(crate) fn exact_money(micros: u64) -> String {
    format!("{}.{:06}", count(micros / 1_000_000), micros % 1_000_000)
}

/// A large count, short: `12.3k`, `4.5M`; for chart axes.
pub(crate) fn short(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => trim(n as f64 / 1e3, "k"),
        1_000_000..1_000_000_000 => trim(n as f64 / 1e6, "M"),
        _ => trim(n as f64 / 1e9, "G"),
    }
}

fn trim(v: f64, unit: &str) -> String {
    let s = format!("{v:.1}");
    format!("{}{unit}", s.strip_suffix(".0").unwrap_or(&s))
}

/// Micro-units, short, for chart axes.
pub(crate) fn short_money(micros: u64) -> String {
    if micros == 0 {
        "0".into()
    } else if micros >= 1_000_000_000 {
        short(micros / 1_000_000)
    } else if micros >= 10_000 {
        let units = micros as f64 / 1e6;
        let s = format!("{units:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        money(micros)
    }
}

/// A time in ms since the epoch, to the minute, in UTC; `never` for 0.
pub(crate) fn when(ms: i64) -> String {
    if ms <= 0 {
        return "never".into();
    }
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "?".into())
}

/// Seconds ago, in the largest unit that fits.
pub(crate) fn ago(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..120 => format!("{s} s ago"),
        120..7_200 => format!("{} min ago", s / 60),
        7_200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// MB as GiB with one decimal: GPU memory as people read it.
pub(crate) fn gib(mb: u64) -> String {
    format!("{:.0} GiB", mb as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_group_thousands() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
    }

    #[test]
    fn money_keeps_fractions_of_a_cent() {
        assert_eq!(money(0), "0.0000");
        assert_eq!(money(240), "0.0002");
        assert_eq!(money(1_500_000), "1.5000");
        // Rounded, not cut: 4,586 micro-units are 0.0046.
        assert_eq!(money(4_586), "0.0046");
        assert_eq!(money(1_234_567_890), "1,234.5679");
        assert_eq!(money(999_950), "1.0000");
        // Spent, if little: not shown as nothing.
        assert_eq!(money(49), "<0.0001");
        assert_eq!(money(50), "0.0001");
    }

    #[test]
    fn exact_money_is_every_micro_unit() {
        assert_eq!(exact_money(0), "0.000000");
        assert_eq!(exact_money(7), "0.000007");
        assert_eq!(exact_money(700), "0.000700");
        assert_eq!(exact_money(1_234_567_890), "1,234.567890");
    }

    #[test]
    fn short_forms_for_axes() {
        assert_eq!(short(950), "950");
        assert_eq!(short(12_300), "12.3k");
        assert_eq!(short(4_000_000), "4M");
        assert_eq!(short_money(250_000), "0.25");
        assert_eq!(short_money(2_000_000), "2");
        assert_eq!(short_money(200), "0.0002");
        assert_eq!(short_money(0), "0", "the axis starts at a plain 0");
    }

    #[test]
    fn times_read_in_utc() {
        assert_eq!(when(0), "never");
        assert_eq!(when(1_780_000_000_000), "2026-05-28 20:26 UTC");
        assert_eq!(ago(5.2), "5 s ago");
        assert_eq!(ago(600.0), "10 min ago");
        assert_eq!(gib(81_920), "80 GiB");
    }
}
