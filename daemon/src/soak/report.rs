//! The soak's verdict from its samples, and its CSV and plot.
//!
//! Warm-up (the first `warmup` fraction of samples: models loading, allocator arenas growing)
//! is left out. Of the rest, the first and the last tenth are compared:
//! - RSS drift: median of the last tenth against median of the first; medians, because a
//!   sample taken while a role is unloaded and reloaded dips for a moment and is not a trend.
//! - FD and thread growth: the least of the last tenth above the most of the first — a leak of
//!   one per turn does that, a pool that grows and shrinks does not.
//! - The budget: no sample's RSS above it, warm-up included.

use std::io::Write;
use std::path::Path;

use super::sample::Sample;

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub samples: usize,
    pub peak_rss_bytes: u64,
    pub budget_bytes: u64,
    /// (last − first) / first of the medians, after warm-up.
    pub rss_drift: f64,
    pub anon_drift: f64,
    pub fds: (u64, u64),
    pub threads: (u64, u64),
    pub failures: Vec<String>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Judge the samples: `max_drift` e.g. 0.02.
pub fn judge(samples: &[Sample], budget_bytes: u64, warmup: f64, max_drift: f64) -> Verdict {
    let mut failures = Vec::new();
    let peak_rss_bytes = samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    if budget_bytes > 0 && peak_rss_bytes > budget_bytes {
        failures.push(format!("RSS peaked at {peak_rss_bytes} B, over the {budget_bytes} B budget"));
    }
    let rest = &samples[((samples.len() as f64 * warmup) as usize).min(samples.len())..];
    let tenth = rest.len() / 10;
    if tenth < 3 {
        failures.push(format!("too few samples after warm-up to judge drift ({}; need 30)", rest.len()));
        return Verdict {
            samples: samples.len(),
            peak_rss_bytes,
            budget_bytes,
            rss_drift: 0.0,
            anon_drift: 0.0,
            fds: (0, 0),
            threads: (0, 0),
            failures,
        };
    }
    let (first, last) = (&rest[..tenth], &rest[rest.len() - tenth..]);
    let drift = |f: fn(&Sample) -> u64| {
        let a = median(first.iter().map(f).collect()) as f64;
        let b = median(last.iter().map(f).collect()) as f64;
        (b - a) / a.max(1.0)
    };
    let rss_drift = drift(|s| s.rss_bytes);
    let anon_drift = drift(|s| s.anon_bytes);
    if rss_drift > max_drift {
        failures.push(format!(
            "RSS drifted by {:+.2}% between the first and the last tenth (limit {:.0}%)",
            rss_drift * 100.0,
            max_drift * 100.0
        ));
    }
    let grew = |f: fn(&Sample) -> u64| {
        let was = first.iter().map(f).max().unwrap_or(0);
        let now = last.iter().map(f).min().unwrap_or(0);
        (was, now)
    };
    let fds = grew(|s| s.fds);
    let threads = grew(|s| s.threads);
    if fds.1 > fds.0 {
        failures.push(format!("open file descriptors grew: at most {} early, at least {} at the end", fds.0, fds.1));
    }
    if threads.1 > threads.0 {
        failures.push(format!("threads grew: at most {} early, at least {} at the end", threads.0, threads.1));
    }
    Verdict { samples: samples.len(), peak_rss_bytes, budget_bytes, rss_drift, anon_drift, fds, threads, failures }
}

pub fn write_csv(path: &Path, samples: &[Sample], budget_bytes: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(f, "t_s,rss_bytes,anon_bytes,fds,threads,turns,budget_bytes")?;
    for s in samples {
        writeln!(
            f,
            "{:.3},{},{},{},{},{},{}",
            s.t_s, s.rss_bytes, s.anon_bytes, s.fds, s.threads, s.turns, budget_bytes
        )?;
    }
    f.flush()
}

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
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable font"))
    })
    .clone()
}

/// Memory over time, RSS and anonymous RSS in MiB: above against the budget line, below
/// zoomed to the process's own range so that drift is visible.
pub fn plot(path: &Path, samples: &[Sample], budget_bytes: u64, title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    register_font()?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let e = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    let (top, bottom) = root.split_vertically(420);
    let t_max = samples.last().map(|s| s.t_s).unwrap_or(1.0).max(1.0);
    let hi = samples.iter().map(|s| s.rss_bytes.max(s.anon_bytes)).max().unwrap_or(0);
    let lo = samples.iter().map(|s| s.rss_bytes.min(s.anon_bytes)).min().unwrap_or(0);
    let pad = (mib(hi) - mib(lo)).max(1.0) * 0.1;
    let panels = [
        (&top, 0.0, mib(budget_bytes.max(hi)) * 1.08, "against the budget", true),
        (&bottom, (mib(lo) - pad).max(0.0), mib(hi) + pad, "zoomed", false),
    ];
    for (area, y0, y1, caption, with_budget) in panels {
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..t_max, y0..y1.max(y0 + 1.0))
            .map_err(e)?;
        chart.configure_mesh().x_desc("time (s)").y_desc("MiB").draw().map_err(e)?;
        chart
            .draw_series(LineSeries::new(samples.iter().map(|s| (s.t_s, mib(s.rss_bytes))), BLUE.stroke_width(2)))
            .map_err(e)?
            .label("RSS")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(samples.iter().map(|s| (s.t_s, mib(s.anon_bytes))), &GREEN))
            .map_err(e)?
            .label("RssAnon")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
        if with_budget && budget_bytes > 0 {
            chart
                .draw_series(LineSeries::new(
                    [(0.0, mib(budget_bytes)), (t_max, mib(budget_bytes))],
                    RED.stroke_width(2),
                ))
                .map_err(e)?
                .label("budget")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize, f: impl Fn(usize) -> (u64, u64, u64)) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let (rss, fds, threads) = f(i);
                Sample { t_s: i as f64, rss_bytes: rss, anon_bytes: rss / 2, fds, threads, turns: i as u64 }
            })
            .collect()
    }

    #[test]
    fn steady_process_passes() {
        let s = run(400, |i| (500_000_000 + (i as u64 % 7) * 1_000_000, 20 + (i as u64 % 3), 9 + (i as u64 % 2)));
        let v = judge(&s, 1_000_000_000, 0.1, 0.02);
        assert!(v.passed(), "{v:?}");
        assert!(v.rss_drift.abs() < 0.02);
    }

    #[test]
    fn a_leak_fails_on_drift_fds_and_threads() {
        let s = run(400, |i| (500_000_000 + i as u64 * 100_000, 20 + i as u64 / 10, 9 + i as u64 / 50));
        let v = judge(&s, 1_000_000_000, 0.1, 0.02);
        assert_eq!(v.failures.len(), 3, "{v:?}");
    }

    #[test]
    fn brief_dips_are_not_drift_and_the_budget_is_checked() {
        // An unload/reload every 40 samples dips for 2 samples.
        let s = run(400, |i| (if i % 40 < 2 { 300_000_000 } else { 500_000_000 }, 20, 9));
        assert!(judge(&s, 1_000_000_000, 0.1, 0.02).passed());
        let v = judge(&s, 400_000_000, 0.1, 0.02);
        assert!(v.failures.iter().any(|f| f.contains("budget")), "{v:?}");
    }

    #[test]
    fn too_short_a_run_is_not_a_pass() {
        let s = run(20, |_| (1, 1, 1));
        assert!(!judge(&s, 0, 0.1, 0.02).passed());
    }

    #[test]
    fn csv_and_plot_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = run(100, |i| (400_000_000 + i as u64 * 10_000, 20, 9));
        write_csv(&dir.path().join("m.csv"), &s, 600_000_000).unwrap();
        let csv = std::fs::read_to_string(dir.path().join("m.csv")).unwrap();
        assert_eq!(csv.lines().count(), 101);
        assert!(csv.starts_with("t_s,rss_bytes,anon_bytes,fds,threads,turns,budget_bytes\n0.000,400000000,"));
        plot(&dir.path().join("m.png"), &s, 600_000_000, "test").unwrap();
        let png = std::fs::read(dir.path().join("m.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}
