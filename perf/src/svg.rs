//! `--histogram FILE.svg`: the latency distribution as a small, dependency-free SVG.
//!
//! Both axes are logarithmic: latency on x (bins of equal width in log space, 24 per
//! decade) so microseconds and milliseconds share one picture, and counts on y so a tail of
//! single samples is still a visible bar beside a peak of thousands. Percentile markers
//! (p50, p99, p99.9, max) are dashed vertical lines.

use std::fmt::Write as _;

/// One distribution to draw: a label (the message size) and `(latency_us, count)` points.
pub struct Series<'a> {
    /// Legend text.
    pub label: String,
    /// Recorded values and their counts (any order).
    pub points: &'a [(f64, u64)],
}

/// Bins per decade of latency.
const BINS_PER_DECADE: f64 = 24.0;
const W: f64 = 880.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// Log-spaced bins: `(lower edge, upper edge, count)` between the smallest and largest value.
pub fn log_bins(points: &[(f64, u64)], lo: f64, hi: f64) -> Vec<(f64, f64, u64)> {
    let (l0, l1) = (lo.log10(), hi.log10());
    let n = (((l1 - l0) * BINS_PER_DECADE).ceil() as usize).max(1);
    let width = (l1 - l0) / n as f64;
    let mut counts = vec![0u64; n];
    for &(v, c) in points {
        if v <= 0.0 || c == 0 {
            continue;
        }
        let i = if width > 0.0 {
            (((v.log10() - l0) / width).floor() as isize).clamp(0, n as isize - 1) as usize
        } else {
            0
        };
        counts[i] += c;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let a = 10f64.powf(l0 + width * i as f64);
            let b = 10f64.powf(l0 + width * (i + 1) as f64);
            (a, b, c)
        })
        .collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}ms", trim(v / 1000.0))
    } else if v >= 1.0 {
        format!("{}us", trim(v))
    } else {
        format!("{}ns", trim(v * 1000.0))
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Renders the SVG document. `markers` are `(name, latency_us)` vertical lines (drawn when
/// there is one series). Returns `None` when there is nothing to draw.
pub fn render(title: &str, series: &[Series<'_>], markers: &[(&str, f64)]) -> Option<String> {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for &(v, c) in all {
        if v > 0.0 && c > 0 {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if !lo.is_finite() {
        return None;
    }
    // Widen to whole bins around the data and never a zero-width axis.
    let lo = lo * 0.9;
    let hi = (hi * 1.1).max(lo * 1.5);
    let binned: Vec<Vec<(f64, f64, u64)>> =
        series.iter().map(|s| log_bins(s.points, lo, hi)).collect();
    let peak = binned
        .iter()
        .flatten()
        .map(|b| b.2)
        .max()
        .unwrap_or(1)
        .max(1);
    let ymax_dec = (peak as f64).log10().ceil().max(1.0);

    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let (l0, l1) = (lo.log10(), hi.log10());
    let x = |v: f64| LEFT + (v.log10() - l0) / (l1 - l0) * pw;
    // log10(1 + count) so a count of 1 has a visible, non-zero height.
    let y = |c: u64| TOP + ph - ((1.0 + c as f64).log10() / (ymax_dec + 0.05)) * ph;

    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        o,
        r#"<rect width="{W}" height="{H}" fill="white"/><text x="{}" y="24" text-anchor="middle" font-size="16">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    // Axes.
    let _ = write!(
        o,
        r##"<g stroke="#333"><line x1="{LEFT}" y1="{}" x2="{}" y2="{}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}"/></g>"##,
        TOP + ph,
        LEFT + pw,
        TOP + ph,
        TOP + ph
    );
    // x ticks at 1, 2, 5 x 10^k inside the range.
    let mut k = l0.floor() as i32;
    while (k as f64) <= l1 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(k);
            if v >= lo && v <= hi {
                let xv = x(v);
                let _ = write!(
                    o,
                    r##"<line x1="{xv:.1}" y1="{}" x2="{xv:.1}" y2="{}" stroke="#333"/><line x1="{xv:.1}" y1="{TOP}" x2="{xv:.1}" y2="{}" stroke="#eee"/><text x="{xv:.1}" y="{}" text-anchor="middle">{}</text>"##,
                    TOP + ph,
                    TOP + ph + 5.0,
                    TOP + ph,
                    TOP + ph + 18.0,
                    fmt_us(v)
                );
            }
        }
        k += 1;
    }
    // y ticks at powers of ten.
    for d in 0..=(ymax_dec as u32) {
        let c = 10u64.pow(d);
        let yv = y(c.saturating_sub(1));
        let _ = write!(
            o,
            r##"<line x1="{}" y1="{yv:.1}" x2="{LEFT}" y2="{yv:.1}" stroke="#333"/><text x="{}" y="{:.1}" text-anchor="end">{c}</text>"##,
            LEFT - 5.0,
            LEFT - 8.0,
            yv + 4.0
        );
    }
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">latency (log scale)</text><text transform="translate(18 {}) rotate(-90)" text-anchor="middle">samples (log scale)</text>"#,
        LEFT + pw / 2.0,
        H - 14.0,
        TOP + ph / 2.0
    );
    // Bars.
    for (i, bins) in binned.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let _ = write!(
            o,
            r#"<g fill="{color}" fill-opacity="{}" stroke="{color}" stroke-width="0.5">"#,
            if series.len() > 1 { 0.45 } else { 0.8 }
        );
        for &(a, b, c) in bins {
            if c == 0 {
                continue;
            }
            let (xa, xb, yc) = (x(a), x(b), y(c));
            let _ = write!(
                o,
                r#"<rect x="{xa:.2}" y="{yc:.2}" width="{:.2}" height="{:.2}"><title>{}..{}: {c}</title></rect>"#,
                (xb - xa).max(0.5),
                TOP + ph - yc,
                fmt_us(a),
                fmt_us(b)
            );
        }
        o.push_str("</g>");
        // Legend.
        let ly = TOP + 14.0 + 16.0 * i as f64;
        let _ = write!(
            o,
            r#"<rect x="{}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{ly}" text-anchor="end">{}</text>"#,
            W - RIGHT - 10.0,
            ly - 9.0,
            W - RIGHT - 16.0,
            esc(&series[i].label)
        );
    }
    if series.len() == 1 {
        for (j, &(name, v)) in markers.iter().enumerate() {
            if v.is_nan() || v <= 0.0 {
                continue;
            }
            let xv = x(v.clamp(lo, hi));
            // Labels start below the legend; near the right edge they end at the line.
            let right = xv > LEFT + pw * 0.7;
            let (tx, anchor) = if right {
                (xv - 3.0, "end")
            } else {
                (xv + 3.0, "start")
            };
            let _ = write!(
                o,
                r##"<line x1="{xv:.1}" y1="{TOP}" x2="{xv:.1}" y2="{}" stroke="#555" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{}" font-size="11" fill="#333" text-anchor="{anchor}">{} {}</text>"##,
                TOP + ph,
                TOP + 34.0 + 13.0 * j as f64,
                esc(name),
                fmt_us(v)
            );
        }
    }
    o.push_str("</svg>\n");
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_keep_every_count_and_are_log_spaced() {
        let pts = [(1.0, 5), (1.5, 2), (10.0, 1), (999.0, 1)];
        let bins = log_bins(&pts, 0.9, 1100.0);
        assert_eq!(bins.iter().map(|b| b.2).sum::<u64>(), 9);
        // Equal ratios between edges: log spacing.
        let r0 = bins[0].1 / bins[0].0;
        let rl = bins.last().unwrap().1 / bins.last().unwrap().0;
        assert!((r0 - rl).abs() < 1e-9);
        assert!((r0 - 10f64.powf(1.0 / BINS_PER_DECADE)).abs() < 0.02);
        // The 999 us sample lands in the last bins, not the first.
        let idx = bins
            .iter()
            .position(|b| b.0 <= 999.0 && 999.0 < b.1)
            .unwrap();
        assert_eq!(bins[idx].2, 1);
        assert!(idx > bins.len() / 2);
    }

    #[test]
    fn renders_well_formed_svg_with_tail_and_markers() {
        let pts = [(1.2, 900), (1.4, 90), (30.0, 1)];
        let s = Series {
            label: "2 B <&>".into(),
            points: &pts,
        };
        let svg = render("send_lat on softnic", &[s], &[("p50", 1.2), ("max", 30.0)]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("2 B &lt;&amp;&gt;"), "labels are escaped");
        assert_eq!(
            svg.matches("<rect x=").count() - 1,
            3,
            "three bars + one legend box"
        );
        assert!(svg.contains("p50 1.2us"));
        assert!(svg.contains("max 30us"));
        // Balanced tags for the element kinds we open.
        for t in ["g", "svg"] {
            assert_eq!(
                svg.matches(&format!("<{t}")).count(),
                svg.matches(&format!("</{t}>")).count(),
                "{t}"
            );
        }
    }

    #[test]
    fn nothing_to_draw() {
        let s = Series {
            label: "x".into(),
            points: &[],
        };
        assert!(render("t", &[s], &[]).is_none());
    }

    #[test]
    fn a_single_value_still_has_an_axis() {
        let pts = [(5.0, 10)];
        let s = Series {
            label: "x".into(),
            points: &pts,
        };
        let svg = render("t", &[s], &[]).unwrap();
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
