//! The benchmark's plots: each setup's audio latency per turn, and each turn against the
//! cascade's.

use std::fmt::Write as _;

use crate::percentile;

/// An SVG document's opening: its size, a white page and the caption.
fn svg_start(width: f64, height: f64, caption: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/><text x=\"10\" y=\"22\" font-weight=\"bold\">{caption}</text>\n"
    )
}

/// A strip plot of audio latencies: one row per setup, a dot per turn, the interquartile box
/// and the median.
pub fn latency_svg(rows: &[(&str, Vec<f64>)], caption: &str) -> String {
    let (left, width, row_height, top) = (190.0, 520.0, 44.0, 40.0);
    let max = rows
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.5f64, f64::max);
    let step = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|s| max / s <= 8.0)
        .unwrap_or(20.0);
    let scale_max = (max / step).ceil() * step;
    let x = |v: f64| left + v / scale_max * width;
    let height = top + rows.len() as f64 * row_height + 50.0;
    let mut svg = svg_start(left + width + 30.0, height, caption);
    let mut tick = 0.0;
    while tick <= scale_max + 1e-9 {
        let _ = writeln!(
            svg,
            r##"<line x1="{0}" x2="{0}" y1="{top}" y2="{1}" stroke="#ddd"/><text x="{0}" y="{2}" text-anchor="middle">{tick}</text>"##,
            x(tick),
            height - 40.0,
            height - 24.0
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">audio latency after the end of speech (s)</text>"#,
        left + width / 2.0,
        height - 6.0
    );
    for (i, (label, values)) in rows.iter().enumerate() {
        let y = top + (i as f64 + 0.5) * row_height;
        let (q1, median, q3) = (
            percentile(values, 0.25),
            percentile(values, 0.5),
            percentile(values, 0.75),
        );
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="end">{label}</text><rect x="{}" y="{}" width="{}" height="22" fill="#cfe0f5" stroke="#4a7ab5"/><line x1="{m}" x2="{m}" y1="{}" y2="{}" stroke="#1f3f6e" stroke-width="3"/>"##,
            left - 10.0,
            y + 4.0,
            x(q1),
            y - 11.0,
            (x(q3) - x(q1)).max(1.0),
            y - 13.0,
            y + 13.0,
            m = x(median)
        );
        for v in values {
            let _ = writeln!(
                svg,
                r##"<circle cx="{}" cy="{y}" r="3" fill="#c0392b" fill-opacity="0.6"/>"##,
                x(*v)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// A scatter of every turn: the audio latency of the cascade runs around a method's run
/// across, the method's up, with the line where they are equal and the one 5 % above it.
pub fn turns_svg(methods: &[(&str, Vec<(f64, f64)>)], caption: &str) -> String {
    const COLOURS: [&str; 6] = [
        "#c0392b", "#2471a3", "#1e8449", "#b9770e", "#7d3c98", "#566573",
    ];
    let (left, top, size) = (60.0, 40.0, 420.0);
    let max = methods
        .iter()
        .flat_map(|(_, v)| v)
        .fold(0.5f64, |a, &(c, m)| a.max(c).max(m));
    let step = [0.25, 0.5, 1.0, 2.0, 5.0]
        .into_iter()
        .find(|s| max / s <= 8.0)
        .unwrap_or(10.0);
    let scale_max = (max / step).ceil() * step;
    let x = |v: f64| left + v / scale_max * size;
    let y = |v: f64| top + size - v / scale_max * size;
    let mut svg = svg_start(left + size + 230.0, top + size + 50.0, caption);
    let mut tick = 0.0;
    while tick <= scale_max + 1e-9 {
        let _ = writeln!(
            svg,
            r##"<line x1="{0}" x2="{0}" y1="{top}" y2="{1}" stroke="#eee"/><line x1="{left}" x2="{2}" y1="{3}" y2="{3}" stroke="#eee"/><text x="{0}" y="{4}" text-anchor="middle">{tick}</text><text x="{5}" y="{6}" text-anchor="end">{tick}</text>"##,
            x(tick),
            top + size,
            left + size,
            y(tick),
            top + size + 16.0,
            left - 6.0,
            y(tick) + 4.0
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/><line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333" stroke-dasharray="4 3"/>"##,
        x(0.0),
        y(0.0),
        x(scale_max),
        y(scale_max),
        x(0.0),
        y(0.0),
        x(scale_max / 1.05),
        y(scale_max)
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">audio latency of the cascade runs around it (s)</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">method's audio latency (s)</text>"#,
        left + size / 2.0,
        top + size + 40.0,
        top + size / 2.0,
        top + size / 2.0
    );
    for (i, (label, values)) in methods.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            svg,
            r#"<circle cx="{}" cy="{}" r="5" fill="{colour}"/><text x="{}" y="{}">{label}</text>"#,
            left + size + 30.0,
            top + 20.0 + i as f64 * 22.0,
            left + size + 42.0,
            top + 25.0 + i as f64 * 22.0
        );
        for &(c, v) in values {
            let _ = writeln!(
                svg,
                r#"<circle cx="{}" cy="{}" r="3.5" fill="{colour}" fill-opacity="0.7"/>"#,
                x(c),
                y(v)
            );
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="11">solid: same latency; dashed: 5 % slower</text>"#,
        left + size + 30.0,
        top + 25.0 + methods.len() as f64 * 22.0
    );
    svg.push_str("</svg>\n");
    svg
}
