//! What a seed run produced: its rows, groups, goals and metric, and the
//! tables (markdown), JSON and charts made from them. The experiments that
//! measure them live in `seeds`; this module knows nothing of how.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub iops: f64,
    pub mib_per_second: f64,
    pub p99_us: f64,
    /// Device bytes written per byte the job wrote (engine and kernel rows).
    pub write_amplification: Option<f64>,
    /// Device requests per I/O (engine rows).
    pub requests_per_io: Option<f64>,
}

/// Rows measured on one shape.
pub struct Group {
    pub name: String,
    pub command: String,
    pub rows: Vec<Row>,
}

impl Group {
    pub fn row(&self, label: &str) -> Option<&Row> {
        self.rows.iter().find(|row| row.label == label)
    }
}

/// A performance goal of DESIGN.md and whether this run met it.
pub struct Goal {
    pub text: String,
    pub value: f64,
    pub target: f64,
    pub met: bool,
}

impl Goal {
    /// A goal met when `value >= target`; the text is derived, so the
    /// number in it is always the one checked.
    pub fn at_least(what: impl std::fmt::Display, value: f64, target: f64) -> Self {
        Self { text: format!("{what} >= {target}"), value, target, met: value >= target }
    }

    /// A goal met when `value <= target` (a bound on a cost).
    pub fn at_most(what: impl std::fmt::Display, value: f64, target: f64) -> Self {
        Self { text: format!("{what} <= {target}"), value, target, met: value <= target }
    }
}

pub struct SeedResult {
    pub id: &'static str,
    pub title: String,
    /// Which figure the table's ratio column and the chart use.
    pub metric: Metric,
    pub groups: Vec<Group>,
    pub goals: Vec<Goal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Iops,
    MibPerSecond,
}

impl Metric {
    pub fn of(self, row: &Row) -> f64 {
        match self {
            Metric::Iops => row.iops,
            Metric::MibPerSecond => row.mib_per_second,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerSecond => "MiB/s",
        }
    }
}

pub(crate) fn format_number(value: f64) -> String {
    if value >= 100.0 {
        let whole = value.round() as u64;
        let digits = whole.to_string();
        let mut out = String::new();
        for (index, digit) in digits.chars().enumerate() {
            if index > 0 && (digits.len() - index).is_multiple_of(3) {
                out.push(',');
            }
            out.push(digit);
        }
        out
    } else {
        format!("{value:.2}")
    }
}

/// The seed's tables in markdown, with ratios to the first row of each
/// group and the goals.
pub fn to_markdown(result: &SeedResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {}\n", result.title);
    for group in &result.groups {
        let _ = writeln!(out, "{}: `fio {}`\n", group.name, group.command);
        let reference = group.rows.first().map_or(0.0, |row| result.metric.of(row));
        let _ = writeln!(
            out,
            "| configuration | IOPS | MiB/s | p99 (us) | device bytes / user byte | requests / IO | {} of {} / this |",
            result.metric.name(),
            group.rows.first().map_or("", |row| row.label.as_str())
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for row in &group.rows {
            let optional =
                |value: Option<f64>| value.map_or("".to_string(), |value| format!("{value:.2}"));
            let value = result.metric.of(row);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.label,
                format_number(row.iops),
                format_number(row.mib_per_second),
                format_number(row.p99_us),
                optional(row.write_amplification),
                optional(row.requests_per_io),
                if value > 0.0 { format!("{:.2}", reference / value) } else { "-".into() }
            );
        }
        let _ = writeln!(out);
        for posted in crate::posted::for_group(result.id, group) {
            let _ = writeln!(out, "- {}", posted.summary(group, result.metric));
        }
        if crate::posted::for_group(result.id, group).next().is_some() {
            let _ = writeln!(out);
        }
    }
    if !result.goals.is_empty() {
        let _ = writeln!(out, "Goals:\n");
        for goal in &result.goals {
            let _ = writeln!(
                out,
                "- {} {}: {:.2}",
                if goal.met { "met" } else { "MISSED" },
                goal.text,
                goal.value
            );
        }
        let _ = writeln!(out);
    }
    out
}

pub fn to_json(result: &SeedResult) -> Value {
    let groups: Vec<Value> = result
        .groups
        .iter()
        .map(|group| {
            let rows: Vec<Value> = group
                .rows
                .iter()
                .map(|row| {
                    json!({
                        "label": row.label,
                        "iops": row.iops,
                        "mib_per_second": row.mib_per_second,
                        "p99_us": row.p99_us,
                        "write_amplification": row.write_amplification,
                        "requests_per_io": row.requests_per_io,
                    })
                })
                .collect();
            let posted: Vec<Value> = crate::posted::for_group(result.id, group)
                .map(|posted| {
                    json!({
                        "setting": posted.setting,
                        "unit": posted.unit,
                        "old": {"label": posted.old.label, "value": posted.old.value},
                        "new": {"label": posted.new.label, "value": posted.new.value},
                        "posted_gain": posted.posted_gain(),
                        "measured_old": posted.measured_old,
                        "measured_new": posted.measured_new,
                        "measured_gain": posted.measured_gain(group, result.metric),
                    })
                })
                .collect();
            json!({"name": group.name, "fio_command": group.command, "rows": rows, "posted": posted})
        })
        .collect();
    let goals: Vec<Value> = result
        .goals
        .iter()
        .map(|goal| json!({"goal": goal.text, "value": goal.value, "target": goal.target, "met": goal.met}))
        .collect();
    json!({"seed": result.id, "title": result.title, "metric": result.metric.name(), "groups": groups, "goals": goals})
}

/// Writes `seed-ID.json`, `seed-ID.md` and (when a font is found)
/// `seed-ID.png` into `dir`; returns the files written.
pub fn write_outputs(dir: &Path, result: &SeedResult) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    let json_path = dir.join(format!("seed-{}.json", result.id));
    std::fs::write(&json_path, serde_json::to_string_pretty(&to_json(result))?)?;
    written.push(json_path);
    let markdown_path = dir.join(format!("seed-{}.md", result.id));
    std::fs::write(&markdown_path, to_markdown(result))?;
    written.push(markdown_path);
    let chart_path = dir.join(format!("seed-{}.png", result.id));
    if crate::chart::draw(&chart_path, result)? {
        written.push(chart_path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goal_states_the_number_it_checks() {
        let met = Goal::at_least("overwrite / exclusive", 12.0, 10.0);
        assert_eq!(met.text, "overwrite / exclusive >= 10");
        assert!(met.met);
        assert!(!Goal::at_least("writeback / raw device", 0.38, 0.9).met);
        let bound = Goal::at_most("a FUSE round trip, us", 10.27, 10.0);
        assert_eq!(bound.text, "a FUSE round trip, us <= 10");
        assert!(!bound.met);
        assert!(Goal::at_most("device bytes per user byte", 1.0, 1.05).met);
    }
}
