//! The contention chart, written as SVG by hand: two panels (owner changes/s, the lock
//! passing to another client, and Jain's
//! index, both on linear scales from 0 so bar heights compare as ratios) grouped by
//! client count, one colour per algorithm.
//! No plotting dependency, and the file diffs readably in review.

use std::fmt::Write;

use crate::locks::Algo;

pub struct Point {
    pub algo: Algo,
    pub clients: usize,
    pub owner_changes_per_s: f64,
    pub jain: f64,
}

fn colour(a: Algo) -> &'static str {
    match a {
        Algo::Rlock => "#d62728",
        Algo::Redisson => "#1f77b4",
        Algo::Polling => "#7f7f7f",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn svg(points: &[Point], algos: &[Algo], clients: &[usize], subtitle: &str) -> String {
    let (w, h) = (960.0, 420.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="16" font-weight="bold">One lock, N clients: acquire → INCR → release</text>"#,
        w / 2.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="40" text-anchor="middle" fill="#555">{}</text>"##,
        w / 2.0,
        esc(subtitle)
    );

    let max_rate = points
        .iter()
        .map(|p| p.owner_changes_per_s)
        .fold(1.0, f64::max);
    let top = nice_ceil(max_rate);
    // `rate`: the handoffs panel; otherwise the Jain panel (0..1).
    let panel = |s: &mut String, x0: f64, title: &str, rate: bool| {
        let (y0, ph, pw) = (70.0, 270.0, 400.0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + pw / 2.0,
            y0 - 8.0,
            esc(title)
        );
        // Axis with gridlines.
        let ticks: Vec<(f64, String)> = if rate {
            (0..=5)
                .map(|i| (i as f64 / 5.0, format_rate(top * i as f64 / 5.0)))
                .collect()
        } else {
            (0..=5)
                .map(|i| (i as f64 / 5.0, format!("{:.1}", i as f64 / 5.0)))
                .collect()
        };
        for (f, label) in ticks {
            let y = y0 + ph - f * ph;
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/>"##,
                x0 + pw
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#,
                x0 - 6.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" x2="{x0}" y1="{y0}" y2="{}" stroke="#333"/>"##,
            y0 + ph
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" x2="{}" y1="{}" y2="{}" stroke="#333"/>"##,
            x0 + pw,
            y0 + ph,
            y0 + ph
        );
        let group_w = pw / clients.len() as f64;
        let bar_w = (group_w * 0.8) / algos.len() as f64;
        for (gi, &n) in clients.iter().enumerate() {
            let gx = x0 + gi as f64 * group_w + group_w * 0.1;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{n} client{}</text>"#,
                gx + group_w * 0.4,
                y0 + ph + 16.0,
                if n == 1 { "" } else { "s" }
            );
            for (ai, &a) in algos.iter().enumerate() {
                let Some(p) = points.iter().find(|p| p.algo == a && p.clients == n) else {
                    continue;
                };
                let (f, label) = if rate {
                    (
                        p.owner_changes_per_s / top,
                        format_rate(p.owner_changes_per_s),
                    )
                } else {
                    (p.jain.clamp(0.0, 1.0), format!("{:.3}", p.jain))
                };
                let bh = f * ph;
                let bx = gx + ai as f64 * bar_w;
                let _ = writeln!(
                    s,
                    r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}: {label}</title></rect>"#,
                    y0 + ph - bh,
                    bar_w - 2.0,
                    colour(a),
                    esc(a.label())
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{label}</text>"#,
                    bx + bar_w / 2.0 - 1.0,
                    y0 + ph - bh - 3.0
                );
            }
        }
    };
    panel(
        &mut s,
        70.0,
        "Owner changes (handoffs) per second (higher is better)",
        true,
    );
    panel(
        &mut s,
        540.0,
        "Jain's fairness index (1 = perfectly even)",
        false,
    );
    // Legend.
    let mut lx = 70.0;
    for &a in algos {
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{}"/>"#,
            h - 36.0,
            colour(a)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 16.0,
            h - 26.0,
            esc(a.label())
        );
        lx += 240.0;
    }
    s.push_str("</svg>\n");
    s
}

/// The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 × 10^k) at or above `x`:
/// an axis top that leaves little of the panel empty.
fn nice_ceil(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * p)
}

pub fn format_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}
