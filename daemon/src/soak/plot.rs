//! The soak's PNG: what a person looks at to see why a soak passed or failed. Three panels over
//! the same time axis: memory against the budget (is it anywhere near?), memory zoomed to the
//! process's own range (is it drifting?), and threads and open FDs (are they climbing?). Each
//! legend sits in a strip of its own on the right of its panel, never over a line: a legend
//! inside the data area hid the RssAnon line once it ran along the bottom.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::mib;
use super::sample::Sample;

/// Width and height of the PNG.
pub const SIZE: (u32, u32) = (1100, 1200);
/// The strip on the right of each panel that holds its legend.
const LEGEND_WIDTH: u32 = 120;
/// From a panel's top to its data area's: the chart's margin and caption.
const LEGEND_TOP: i32 = 48;

/// Fonts plotters can draw text with: the first one found (Debian's fonts-dejavu-core).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/system/fonts/Roboto-Regular.ttf",
];

fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let path = FONTS.iter().find(|p| Path::new(p).is_file()).ok_or_else(|| {
            format!(
                "no font for the plot's text (looked for {}; Debian: apt install fonts-dejavu-core)",
                FONTS.join(", ")
            )
        })?;
        let bytes: &'static [u8] =
            Box::leak(std::fs::read(path).map_err(|e| format!("{path}: {e}"))?.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable font"))
    })
    .clone()
}

// Dark enough to read on white as thin lines (plotters' GREEN is not).
const RSS: RGBColor = RGBColor(30, 60, 220);
const ANON: RGBColor = RGBColor(0, 150, 60);
const BUDGET: RGBColor = RGBColor(220, 30, 30);
const THREADS: RGBColor = RGBColor(230, 120, 0);
const FDS: RGBColor = RGBColor(140, 40, 170);

/// One line of a panel: its legend label, colour and width, and its points.
struct Line<Y> {
    label: &'static str,
    color: RGBColor,
    width: u32,
    points: Vec<(f64, Y)>,
}

/// What drawing on a backend returns.
type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Memory and counts over time: see the module's doc.
pub fn plot(path: &Path, samples: &[Sample], budget_bytes: u64, title: &str) -> Result<(), String> {
    register_font()?;
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    let panels = root.split_evenly((3, 1));
    let t_max = samples.last().map(|s| s.t_s).unwrap_or(1.0).max(1.0);

    let memory = |f: fn(&Sample) -> u64| steps(samples.iter().map(|s| (s.t_s, mib(f(s)))));
    let mut lines = vec![
        Line { label: "RSS", color: RSS, width: 2, points: memory(|s| s.rss_bytes) },
        Line { label: "RssAnon", color: ANON, width: 1, points: memory(|s| s.anon_bytes) },
    ];
    let hi = samples.iter().map(|s| s.rss_bytes.max(s.anon_bytes)).max().unwrap_or(0);
    let lo = samples.iter().map(|s| s.rss_bytes.min(s.anon_bytes)).min().unwrap_or(0);
    let pad = (mib(hi) - mib(lo)).max(1.0) * 0.1;
    panel(&panels[1], "zoomed", "MiB", t_max, (mib(lo) - pad).max(0.0)..mib(hi) + pad, &lines).map_err(e)?;
    if budget_bytes > 0 {
        let points = vec![(0.0, mib(budget_bytes)), (t_max, mib(budget_bytes))];
        lines.push(Line { label: "budget", color: BUDGET, width: 2, points });
    }
    let top = mib(budget_bytes.max(hi)).max(1.0) * 1.08;
    panel(&panels[0], "against the budget", "MiB", t_max, 0.0..top, &lines).map_err(e)?;

    let count = |f: fn(&Sample) -> u64| steps(samples.iter().map(|s| (s.t_s, f(s))));
    let counts = [
        Line { label: "threads", color: THREADS, width: 2, points: count(|s| s.threads) },
        Line { label: "open FDs", color: FDS, width: 2, points: count(|s| s.fds) },
    ];
    let hi = samples.iter().map(|s| s.threads.max(s.fds)).max().unwrap_or(0);
    let lo = samples.iter().map(|s| s.threads.min(s.fds)).min().unwrap_or(0);
    panel(&panels[2], "threads and open FDs", "count", t_max, lo.saturating_sub(2)..hi + 2, &counts).map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// A line as steps: a value holds until the next sample (a slope would show 7.5 threads), and
/// plotters draws a wide line with a sharp turn as a spike across the image (a reading up and
/// down again within a pixel), while square turns it draws right.
fn steps<Y: Copy>(points: impl Iterator<Item = (f64, Y)>) -> Vec<(f64, Y)> {
    let mut out: Vec<(f64, Y)> = Vec::new();
    for (t, v) in points {
        if let Some(&(_, was)) = out.last() {
            out.push((t, was));
        }
        out.push((t, v));
    }
    out
}

/// One panel: its lines in the data area, their legend in the strip on its right.
fn panel<DB, Y>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    unit: &str,
    t_max: f64,
    y: std::ops::Range<Y>,
    lines: &[Line<Y>],
) -> Drawn<DB>
where
    DB: DrawingBackend,
    Y: Copy + 'static,
    std::ops::Range<Y>: plotters::coord::ranged1d::AsRangedCoord<Value = Y>,
    <std::ops::Range<Y> as plotters::coord::ranged1d::AsRangedCoord>::CoordDescType:
        plotters::coord::ranged1d::ValueFormatter<Y>,
{
    let (width, _) = area.dim_in_pixel();
    let (data, strip) = area.split_horizontally(width.saturating_sub(LEGEND_WIDTH));
    let mut chart = ChartBuilder::on(&data)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..t_max, y)?;
    chart.configure_mesh().x_desc("time (s)").y_desc(unit).draw()?;
    for l in lines {
        chart.draw_series(LineSeries::new(l.points.iter().copied(), l.color.stroke_width(l.width)))?;
    }
    legend(&strip, lines)
}

/// The legend in its own strip: a stroke of each line's colour and its label, one per row.
fn legend<DB: DrawingBackend, Y>(strip: &DrawingArea<DB, Shift>, lines: &[Line<Y>]) -> Drawn<DB> {
    for (i, l) in lines.iter().enumerate() {
        let y = LEGEND_TOP + 8 + i as i32 * 24;
        strip.draw(&PathElement::new(vec![(4, y), (30, y)], l.color.stroke_width(l.width.max(2))))?;
        strip.draw(&Text::new(l.label, (38, y - 8), ("sans-serif", 15)))?;
    }
    Ok(())
}
