//! Charts drawn on the server as inline SVG: no CDN, no script, nothing
//! for the Content-Security-Policy to allow. The markup is generated here
//! from numbers; the only strings in it (titles, group names, bucket
//! labels) are escaped, so a page may include it with `|safe`.

use std::fmt::Write;

/// A stacked bar chart: one bar per bucket, one stacked segment per series.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    pub title: String,
    /// One label per bucket (shown under some bars and in every tooltip).
    pub buckets: Vec<String>,
    /// Name and one value per bucket, bottom of the stack first.
    pub series: Vec<(String, Vec<u64>)>,
    /// How an axis value or a tooltip value reads.
    pub format: fn(u64) -> String,
}

const WIDTH: f64 = 880.0;
const PLOT_HEIGHT: f64 = 200.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 28.0;
/// Room for the bucket labels under the plot.
const UNDER: f64 = 30.0;
const LEGEND_ROW: f64 = 18.0;
const LEGEND_PER_ROW: usize = 4;
/// The most bucket labels drawn under the axis, so they never overlap.
const MAX_X_LABELS: usize = 8;
/// Distinguishable colours, and grey for the last series when it is
/// "everything else".
const PALETTE: [&str; 7] = [
    "#1f5fbf", "#d97706", "#1a7f37", "#b42318", "#7c3aed", "#0e7490", "#a16207",
];
pub(crate) const OTHER_COLOUR: &str = "#9aa4ae";
pub(crate) const OTHER: &str = "other";

/// One drawn segment, in SVG user units.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Segment {
    bucket: usize,
    series: usize,
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

/// The y axis: ticks from 0 to `top` in equal, round steps.
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    top: u64,
    ticks: Vec<u64>,
}

/// A round step (1, 2 or 5 times a power of ten) that splits `max` into
/// at most five parts.
fn axis(max: u64) -> Axis {
    if max == 0 {
        return Axis {
            top: 1,
            ticks: vec![0, 1],
        };
    }
    let rough = max.div_ceil(5);
    let mut magnitude = 1u64;
    while magnitude.saturating_mul(10) <= rough {
        magnitude *= 10;
    }
    let step = [1, 2, 5, 10]
        .into_iter()
        .map(|m| magnitude.saturating_mul(m))
        .find(|s| *s >= rough)
        .unwrap_or(rough);
    let top = max.div_ceil(step).saturating_mul(step);
    let ticks = (0..=top / step).map(|i| i * step).collect();
    Axis { top, ticks }
}

fn totals(chart: &Chart) -> Vec<u64> {
    (0..chart.buckets.len())
        .map(|b| {
            chart
                .series
                .iter()
                .map(|(_, v)| v.get(b).copied().unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        })
        .collect()
}

fn layout(chart: &Chart, axis: &Axis) -> Vec<Segment> {
    let n = chart.buckets.len();
    if n == 0 {
        return Vec::new();
    }
    let slot = (WIDTH - LEFT - RIGHT) / n as f64;
    // Thin bars touch; wider ones get a gap so they read as bars.
    let gap = if slot > 4.0 { slot * 0.15 } else { 0.0 };
    let scale = PLOT_HEIGHT / axis.top as f64;
    let mut out = Vec::new();
    for b in 0..n {
        let mut base = 0u64;
        for (s, (_, values)) in chart.series.iter().enumerate() {
            let v = values.get(b).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            let top = base.saturating_add(v);
            let y_top = TOP + PLOT_HEIGHT - top as f64 * scale;
            let y_base = TOP + PLOT_HEIGHT - base as f64 * scale;
            out.push(Segment {
                bucket: b,
                series: s,
                x: LEFT + b as f64 * slot + gap / 2.0,
                y: y_top,
                w: slot - gap,
                h: y_base - y_top,
            });
            base = top;
        }
    }
    out
}

/// Text for SVG character data and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn colour(chart: &Chart, series: usize) -> &'static str {
    let last = series + 1 == chart.series.len();
    if last && chart.series[series].0 == OTHER {
        OTHER_COLOUR
    } else {
        PALETTE[series % PALETTE.len()]
    }
}

/// The chart as an `<svg>` element.
pub(crate) fn stacked_bars(chart: &Chart) -> String {
    let max = totals(chart).into_iter().max().unwrap_or(0);
    let axis = axis(max);
    let legend_rows = chart.series.len().div_ceil(LEGEND_PER_ROW);
    let height = TOP + PLOT_HEIGHT + UNDER + legend_rows as f64 * LEGEND_ROW + 6.0;
    let title = escape(&chart.title);
    let mut svg = String::with_capacity(4096);
    // Writing into a String cannot fail.
    let _ = write!(
        svg,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0}" role="img" aria-label="{title}"><title>{title}</title>"#
    );
    let _ = write!(
        svg,
        r##"<text x="{LEFT}" y="16" font-size="13" font-weight="600" fill="#1b1f24">{title}</text>"##
    );
    // Grid lines and y labels.
    for t in &axis.ticks {
        let y = TOP + PLOT_HEIGHT - *t as f64 * PLOT_HEIGHT / axis.top as f64;
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#e3e7eb" stroke-width="1"/><text x="{lx}" y="{ty:.1}" font-size="11" text-anchor="end" fill="#5b6570">{label}</text>"##,
            x2 = WIDTH - RIGHT,
            lx = LEFT - 6.0,
            ty = y + 4.0,
            label = escape(&(chart.format)(*t)),
        );
    }
    // Axes.
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}" stroke="#5b6570" stroke-width="1"/><line x1="{LEFT}" y1="{base}" x2="{right}" y2="{base}" stroke="#5b6570" stroke-width="1"/>"##,
        base = TOP + PLOT_HEIGHT,
        right = WIDTH - RIGHT,
    );
    if max == 0 {
        let _ = write!(
            svg,
            r##"<text x="{x}" y="{y}" font-size="13" text-anchor="middle" fill="#5b6570">nothing in this range</text>"##,
            x = LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
            y = TOP + PLOT_HEIGHT / 2.0,
        );
    }
    for s in layout(chart, &axis) {
        let value = chart.series[s.series].1[s.bucket];
        let _ = write!(
            svg,
            r#"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{} · {}: {}</title></rect>"#,
            s.x,
            s.y,
            s.w,
            s.h,
            colour(chart, s.series),
            escape(&chart.buckets[s.bucket]),
            escape(&chart.series[s.series].0),
            escape(&(chart.format)(value)),
        );
    }
    // Bucket labels under the axis, evenly thinned.
    let n = chart.buckets.len();
    if n > 0 {
        let every = n.div_ceil(MAX_X_LABELS);
        let slot = (WIDTH - LEFT - RIGHT) / n as f64;
        for (i, label) in chart.buckets.iter().enumerate().step_by(every) {
            let _ = write!(
                svg,
                r##"<text x="{x:.1}" y="{y}" font-size="11" text-anchor="middle" fill="#5b6570">{label}</text>"##,
                x = LEFT + (i as f64 + 0.5) * slot,
                y = TOP + PLOT_HEIGHT + 16.0,
                label = escape(label),
            );
        }
    }
    // Legend.
    let column = (WIDTH - LEFT - RIGHT) / LEGEND_PER_ROW as f64;
    for (i, (name, _)) in chart.series.iter().enumerate() {
        let x = LEFT + (i % LEGEND_PER_ROW) as f64 * column;
        let y = TOP + PLOT_HEIGHT + UNDER + (i / LEGEND_PER_ROW) as f64 * LEGEND_ROW;
        let _ = write!(
            svg,
            r##"<rect x="{x:.1}" y="{y:.1}" width="11" height="11" fill="{c}"/><text x="{tx:.1}" y="{ty:.1}" font-size="12" fill="#1b1f24">{name}</text>"##,
            c = colour(chart, i),
            tx = x + 16.0,
            ty = y + 10.0,
            name = escape(name),
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(v: u64) -> String {
        v.to_string()
    }

    fn chart(series: Vec<(&str, Vec<u64>)>) -> Chart {
        let n = series.first().map_or(0, |s| s.1.len());
        Chart {
            title: "Requests".into(),
            buckets: (0..n).map(|i| format!("b{i}")).collect(),
            series: series.into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
            format: plain,
        }
    }

    #[test]
    fn the_axis_ends_on_a_round_number_above_the_tallest_bar() {
        assert_eq!(axis(950).ticks, vec![0, 200, 400, 600, 800, 1000]);
        assert_eq!(axis(10).ticks, vec![0, 2, 4, 6, 8, 10]);
        assert_eq!(axis(3).ticks, vec![0, 1, 2, 3]);
        assert_eq!(axis(1_234_567).top, 1_500_000);
        assert_eq!(axis(0).ticks, vec![0, 1]);
        let huge = axis(u64::MAX / 2);
        assert!(huge.top >= u64::MAX / 2);
    }

    #[test]
    fn bars_are_as_tall_as_their_values_and_stack() {
        let c = chart(vec![("a", vec![0, 5, 10]), ("b", vec![0, 5, 0])]);
        let a = axis(10);
        let segs = layout(&c, &a);
        // Nothing drawn for zero; the stacked bucket reaches the top.
        assert_eq!(segs.len(), 3);
        let full = PLOT_HEIGHT;
        let b1: Vec<_> = segs.iter().filter(|s| s.bucket == 1).collect();
        assert_eq!(b1.len(), 2);
        assert!((b1[0].h - full / 2.0).abs() < 1e-9);
        assert!(
            (b1[1].y - TOP).abs() < 1e-9,
            "the stack's top is the plot's top"
        );
        assert!((b1[0].y - (b1[1].y + b1[1].h)).abs() < 1e-9, "b sits on a");
        let b2 = segs.iter().find(|s| s.bucket == 2).expect("drawn");
        assert!((b2.h - full).abs() < 1e-9);
        assert!(b2.x > b1[0].x, "buckets run left to right");
    }

    #[test]
    fn names_and_labels_are_escaped() {
        let mut c = chart(vec![("<script>alert(1)</script>", vec![3])]);
        c.title = "a \"quoted\" & <b>title</b>".into();
        c.buckets = vec!["<i>".into()];
        let svg = stacked_bars(&c);
        assert!(!svg.contains("<script"), "{svg}");
        assert!(!svg.contains("<b>") && !svg.contains("<i>"));
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(svg.contains("a &quot;quoted&quot; &amp; &lt;b&gt;title&lt;/b&gt;"));
        assert!(!svg.contains("style="), "the CSP allows no inline style");
    }

    #[test]
    fn the_svg_has_ticks_a_legend_and_a_tooltip_per_segment() {
        let c = chart(vec![("p1", vec![950, 100]), (OTHER, vec![0, 7])]);
        let svg = stacked_bars(&c);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        for tick in ["200", "400", "600", "800", "1000"] {
            assert!(svg.contains(&format!(">{tick}</text>")), "tick {tick}");
        }
        assert!(svg.contains("<title>b0 · p1: 950</title>"));
        assert!(svg.contains("<title>b1 · other: 7</title>"));
        assert!(
            svg.contains(&format!("fill=\"{OTHER_COLOUR}\"")),
            "other is grey"
        );
        assert!(svg.contains(">p1</text>") && svg.contains(">other</text>"));
    }

    #[test]
    fn an_empty_range_says_so() {
        let svg = stacked_bars(&chart(vec![("p1", vec![0, 0, 0])]));
        assert!(svg.contains("nothing in this range"));
        assert_eq!(
            svg.matches("<rect").count(),
            1,
            "the legend's swatch, no bars"
        );
        let none = stacked_bars(&chart(vec![]));
        assert!(none.contains("nothing in this range"));
    }

    #[test]
    fn at_most_eight_bucket_labels_are_drawn() {
        let c = chart(vec![("p", vec![1; 168])]);
        let svg = stacked_bars(&c);
        let drawn = (0..168)
            .filter(|i| svg.contains(&format!(">b{i}</text>")))
            .count();
        assert!((1..=MAX_X_LABELS).contains(&drawn), "{drawn} labels");
    }
}
