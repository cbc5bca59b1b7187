//! The results: a table of timed cases against their baselines, figures
//! that are not times, and the same as Markdown and as an SVG chart.

use std::fmt::Write;
use std::time::Duration;

/// What a case must reach: as a ratio to its baseline's median, or to
/// another row's (named `name` in the verdict).
#[derive(Clone, Copy)]
pub enum Target {
    /// Takes at most this many times the baseline's time.
    AtMost(f64),
    /// Moves at least this share of the baseline's bytes per second.
    AtLeastShare(f64),
    /// Takes at most this long (median), whatever the baseline takes.
    Within(Duration),
    /// Takes at most `times` the median of the row `of`.
    AtMostTimesOf {
        of: RowId,
        times: f64,
        name: &'static str,
    },
    /// Takes at most `more` longer than the median of the row `of`.
    AtMostAbove {
        of: RowId,
        more: Duration,
        name: &'static str,
    },
    /// Moves at least `times` the bytes per second of the row `of`.
    AtLeastRateOf {
        of: RowId,
        times: f64,
        name: &'static str,
    },
}

struct Row {
    section: &'static str,
    name: String,
    samples: Vec<Duration>,
    /// Index of the baseline row; `None` for a baseline.
    baseline: Option<usize>,
    /// Bytes delivered per run, for rows that move data.
    bytes: Option<u64>,
    /// Every target must be met; the verdict says each.
    targets: Vec<Target>,
    /// Rows (a floor, named) this one is also shown against, after its
    /// verdicts: a share of their rate, or a multiple of their time.
    relative: Vec<(usize, &'static str)>,
    note: String,
}

struct Figure {
    section: &'static str,
    name: String,
    value: String,
    verdict: Option<(String, bool)>,
}

impl Figure {
    fn verdict_text(&self) -> String {
        self.verdict
            .as_ref()
            .map(|(target, ok)| met(*ok, target))
            .unwrap_or_default()
    }
}

pub struct Report {
    quick: bool,
    rows: Vec<Row>,
    figures: Vec<Figure>,
}

/// A handle on a baseline row, for the rows measured against it.
#[derive(Clone, Copy)]
pub struct Baseline(usize);

impl Baseline {
    /// The baseline as a row, for a target or a figure relative to it.
    pub fn row(self) -> RowId {
        RowId(self.0)
    }
}

/// A handle on any row, for a target relative to it.
#[derive(Clone, Copy)]
pub struct RowId(usize);

impl Report {
    pub fn new(quick: bool) -> Report {
        Report {
            quick,
            rows: Vec::new(),
            figures: Vec::new(),
        }
    }

    pub fn baseline(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        samples: Vec<Duration>,
        bytes: Option<u64>,
    ) -> Baseline {
        self.rows.push(Row {
            section,
            name: name.into(),
            samples: sorted(samples),
            baseline: None,
            bytes,
            targets: Vec::new(),
            relative: Vec::new(),
            note: String::new(),
        });
        Baseline(self.rows.len() - 1)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn case(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        samples: Vec<Duration>,
        baseline: Baseline,
        bytes: Option<u64>,
        target: Option<Target>,
        note: impl Into<String>,
    ) -> RowId {
        self.rows.push(Row {
            section,
            name: name.into(),
            samples: sorted(samples),
            baseline: Some(baseline.0),
            bytes,
            targets: target.into_iter().collect(),
            relative: Vec::new(),
            note: note.into(),
        });
        RowId(self.rows.len() - 1)
    }

    /// Another target `row` must meet as well as those it has.
    pub fn also(&mut self, row: RowId, target: Target) {
        self.rows[row.0].targets.push(target);
    }

    /// Shows `row` against the row `of` as well (its floor, say), named
    /// `name`: no target, where it stands.
    pub fn relative(&mut self, row: RowId, of: RowId, name: &'static str) {
        self.rows[row.0].relative.push((of.0, name));
    }

    /// The bytes per second `row` moved at its median, for rows that
    /// move bytes.
    pub fn rate(&self, row: RowId) -> Option<f64> {
        rate_of(&self.rows[row.0])
    }

    /// A figure, `name`, saying whether `times` the rate of the row `of`
    /// is above the rate of the row `floor`: where it is, a target of
    /// that many times `of`'s rate is out of reach on this machine.
    pub fn reach(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        times: f64,
        of: RowId,
        floor: RowId,
    ) {
        let mib = |row: RowId| self.rate(row).unwrap_or(0.0) / f64::from(1u32 << 20);
        let (asked, most) = (times * mib(of), mib(floor));
        let verdict = if asked > most {
            "above the floor: out of reach here"
        } else {
            "within the floor"
        };
        self.figure(
            section,
            name,
            format!("{asked:.0} against {most:.0} MiB/s, {verdict}"),
            None,
        );
    }

    /// Where `row` stands against `of`: for rows that move bytes, its rate
    /// as a share of `of`'s; otherwise its time as a multiple of `of`'s,
    /// and how much longer.
    fn standing(&self, row: &Row, of: &Row, name: &str) -> String {
        match (rate_of(row), rate_of(of)) {
            (Some(rate), Some(other)) => {
                format!("{:.0} % of {name}", 100.0 * rate / other.max(1e-9))
            }
            _ => {
                let (median, other) = (secs(median_of(row)), secs(median_of(of)));
                format!(
                    "{:.2}x {name} ({:+.0} ms)",
                    median / other,
                    (median - other) * 1e3
                )
            }
        }
    }

    /// A figure that is not a time; `verdict` is the target and whether it
    /// was met.
    pub fn figure(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        value: impl Into<String>,
        verdict: Option<(String, bool)>,
    ) {
        self.figures.push(Figure {
            section,
            name: name.into(),
            value: value.into(),
            verdict,
        });
    }

    /// The row's cost as a multiple of its baseline's: time per run, or for
    /// rows that move bytes, time per byte delivered.
    fn cost_ratio(&self, row: &Row) -> Option<f64> {
        self.ratio_at(row, median_of(row))
    }

    /// What [`Report::cost_ratio`] would be if `row`'s median were `time`.
    fn ratio_at(&self, row: &Row, time: Duration) -> Option<f64> {
        let base = &self.rows[row.baseline?];
        let time = secs(time) / secs(median_of(base));
        Some(match (row.bytes, base.bytes) {
            (Some(bytes), Some(base_bytes)) => time * base_bytes as f64 / bytes.max(1) as f64,
            _ => time,
        })
    }

    /// The longest median `row` may have and meet `target`, as a ratio to
    /// its baseline (what the chart marks).
    fn limit_ratio(&self, row: &Row, target: Target) -> Option<f64> {
        let time = match target {
            Target::AtMost(limit) => return Some(limit),
            Target::AtLeastShare(share) => return Some(1.0 / share),
            Target::Within(limit) => limit,
            Target::AtMostTimesOf { of, times, .. } => median_of(&self.rows[of.0]).mul_f64(times),
            Target::AtMostAbove { of, more, .. } => median_of(&self.rows[of.0]) + more,
            Target::AtLeastRateOf { of, times, .. } => {
                let rate = times * rate_of(&self.rows[of.0])?;
                Duration::from_secs_f64(row.bytes? as f64 / rate.max(1e-9))
            }
        };
        self.ratio_at(row, time)
    }

    /// Whether `row` meets `target`, and what the target is, with where
    /// the row stands for a target relative to another row.
    fn verdict(&self, row: &Row, target: Target) -> String {
        let median = median_of(row);
        let ratio = self.cost_ratio(row).unwrap_or(f64::INFINITY);
        match target {
            Target::AtMost(limit) => met(ratio <= limit, &format!("<= {limit}x")),
            Target::AtLeastShare(share) => {
                met(1.0 / ratio >= share, &format!(">= {:.0} %", share * 100.0))
            }
            Target::Within(limit) => {
                met(median <= limit, &format!("<= {:.1} s", limit.as_secs_f64()))
            }
            Target::AtMostTimesOf { of, times, name } => {
                let times_of = secs(median) / secs(median_of(&self.rows[of.0]));
                met(
                    times_of <= times,
                    &format!("<= {times}x {name}: {times_of:.2}x"),
                )
            }
            Target::AtMostAbove { of, more, name } => {
                let above = secs(median) - secs(median_of(&self.rows[of.0]));
                met(
                    above <= more.as_secs_f64(),
                    &format!(
                        "<= {name} + {} ms: {above_ms:+.2} ms",
                        more.as_secs_f64() * 1e3,
                        above_ms = above * 1e3
                    ),
                )
            }
            Target::AtLeastRateOf { of, times, name } => {
                let times_of = match (rate_of(row), rate_of(&self.rows[of.0])) {
                    (Some(rate), Some(other)) => rate / other.max(1e-9),
                    _ => 0.0,
                };
                met(
                    times_of >= times,
                    &format!(">= {times}x {name}: {times_of:.2}x"),
                )
            }
        }
    }

    fn cells(&self, row: &Row) -> [String; 7] {
        let median = median(&row.samples);
        let (ratio, verdict) = match self.cost_ratio(row) {
            None => ("baseline".to_string(), String::new()),
            Some(ratio) => {
                let shown = match row.bytes {
                    Some(_) => format!("{ratio:.2}x ({:.0} %)", 100.0 / ratio),
                    None => format!("{ratio:.2}x"),
                };
                let verdicts: Vec<String> = row
                    .targets
                    .iter()
                    .map(|target| self.verdict(row, *target))
                    .chain(
                        row.relative
                            .iter()
                            .map(|(of, name)| self.standing(row, &self.rows[*of], name)),
                    )
                    .collect();
                (shown, verdicts.join("; "))
            }
        };
        let rate = row
            .bytes
            .map(|bytes| {
                format!(
                    "{:.0} MiB/s",
                    bytes as f64 / (1 << 20) as f64 / secs(median)
                )
            })
            .unwrap_or_default();
        let name = if row.note.is_empty() {
            row.name.clone()
        } else {
            format!("{} ({})", row.name, row.note)
        };
        [
            name,
            show(median),
            show(row.samples[0]),
            show(*row.samples.last().unwrap_or(&Duration::ZERO)),
            rate,
            ratio,
            verdict,
        ]
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let header = [
            "case",
            "median",
            "min",
            "max",
            "rate",
            "vs baseline",
            "target",
        ];
        let mut section = "";
        let table: Vec<(&str, [String; 7])> = self
            .rows
            .iter()
            .map(|row| (row.section, self.cells(row)))
            .collect();
        let mut widths = header.map(str::len);
        for (_, cells) in &table {
            for (width, cell) in widths.iter_mut().zip(cells) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut text = String::new();
            for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
                let pad = width - cell.chars().count();
                if i == 0 {
                    let _ = write!(text, "{cell}{}", " ".repeat(pad));
                } else {
                    let _ = write!(text, "  {}{cell}", " ".repeat(pad));
                }
            }
            text.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(&header.map(String::from)));
        for (row_section, cells) in &table {
            if *row_section != section {
                section = row_section;
                let _ = writeln!(out, "-- {section}");
            }
            let _ = writeln!(out, "{}", line(cells));
        }
        for figure in &self.figures {
            let _ = writeln!(
                out,
                "{:<11} {}: {} {}",
                figure.section,
                figure.name,
                figure.value,
                figure.verdict_text()
            );
        }
        if self.quick {
            let _ = writeln!(
                out,
                "(--quick: small sizes, a smoke run; figures are not meaningful)"
            );
        }
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| case | median | min | max | rate | vs baseline | target |\n\
             |---|--:|--:|--:|--:|--:|---|\n",
        );
        let mut section = "";
        for row in &self.rows {
            if row.section != section {
                section = row.section;
                let _ = writeln!(out, "| **{section}** | | | | | | |");
            }
            let cells = self.cells(row).map(|cell| cell.replace('|', "\\|"));
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        out.push_str("\n| figure | value | target |\n|---|---|---|\n");
        for figure in &self.figures {
            let _ = writeln!(
                out,
                "| {}: {} | {} | {} |",
                figure.section,
                figure.name,
                figure.value,
                figure.verdict_text()
            );
        }
        out
    }

    /// A horizontal bar per case: its time as a multiple of its baseline's
    /// (1x = as fast as running it locally), with its target marked.
    pub fn svg(&self) -> String {
        let cases: Vec<(&Row, f64)> = self
            .rows
            .iter()
            .filter_map(|row| Some((row, self.cost_ratio(row)?)))
            .collect();
        let (label_width, bar_width, row_height, top) = (360.0, 420.0, 22.0, 46.0);
        let scale_max = cases
            .iter()
            .map(|(_, ratio)| *ratio)
            .fold(2.0_f64, f64::max)
            .min(12.0)
            .ceil();
        let x = |ratio: f64| label_width + bar_width * ratio.min(scale_max) / scale_max;
        let height = top + row_height * cases.len() as f64 + 30.0;
        let width = label_width + bar_width + 90.0;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">capexec time as a \
             multiple of the local baseline (median; lower is better)</text>\n\
             <text x=\"10\" y=\"36\" fill=\"#555\">| marks the target; 1x = running it locally</text>\n"
        );
        for tick in 0..=scale_max as u32 {
            let tx = x(f64::from(tick));
            let _ = writeln!(
                svg,
                "<line x1=\"{tx:.1}\" y1=\"{top}\" x2=\"{tx:.1}\" y2=\"{}\" stroke=\"#ddd\"/>\
                 <text x=\"{tx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{tick}x</text>",
                height - 24.0,
                height - 10.0
            );
        }
        for (i, (row, ratio)) in cases.iter().enumerate() {
            let y = top + row_height * i as f64;
            // The strictest of the row's targets, as a ratio to its
            // baseline.
            let limit = row
                .targets
                .iter()
                .filter_map(|target| self.limit_ratio(row, *target))
                .reduce(f64::min);
            let colour = match limit {
                Some(limit) if *ratio > limit => "#d9534f",
                Some(_) => "#5cb85c",
                None => "#5b8bd9",
            };
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\
                 <rect x=\"{label_width}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"{colour}\"/>\
                 <text x=\"{:.1}\" y=\"{}\">{ratio:.2}x</text>",
                label_width - 8.0,
                y + 15.0,
                escape(&format!("{}: {}", row.section, row.name)),
                y + 3.0,
                x(*ratio) - label_width,
                row_height - 6.0,
                x(*ratio) + 4.0,
                y + 15.0,
            );
            if let Some(limit) = limit {
                let lx = x(limit);
                let _ = writeln!(
                    svg,
                    "<line x1=\"{lx:.1}\" y1=\"{}\" x2=\"{lx:.1}\" y2=\"{}\" stroke=\"black\" \
                     stroke-width=\"2\"/>",
                    y + 1.0,
                    y + row_height - 1.0
                );
            }
        }
        svg.push_str("</svg>\n");
        svg
    }
}

fn met(ok: bool, target: &str) -> String {
    if ok {
        format!("met ({target})")
    } else {
        format!("MISSED ({target})")
    }
}

fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

fn median(samples: &[Duration]) -> Duration {
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn median_of(row: &Row) -> Duration {
    median(&row.samples)
}

/// Bytes per second at the row's median, for rows that move bytes.
fn rate_of(row: &Row) -> Option<f64> {
    Some(row.bytes? as f64 / secs(median_of(row)))
}

fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64().max(1e-9)
}

fn show(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 10_000.0 {
        format!("{micros:.0} µs")
    } else if micros < 10_000_000.0 {
        format!("{:.1} ms", micros / 1000.0)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
