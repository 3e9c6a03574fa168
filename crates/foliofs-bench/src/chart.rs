//! One PNG bar chart per seed (plotters): a cluster of bars per shape, one
//! bar per configuration, in the seed's metric. Text needs a TrueType font;
//! the system's DejaVu Sans (Debian's fonts-dejavu-core) is loaded at run
//! time, and without one the chart is skipped with a note.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

use crate::results::SeedResult;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers the first font found as plotters' sans-serif; false if none.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        for path in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Tableau's ten colours, told apart also in greyscale-ish print.
const PALETTE: &[RGBColor] = &[
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of configuration `index` of `count`: each its own, never one
/// shared by two configurations (the palette wrapped before: foliofs and
/// kernel xfs were both blue). Past the palette, hues spread evenly.
fn colour(index: usize, count: usize) -> RGBColor {
    if count <= PALETTE.len() {
        return PALETTE[index];
    }
    let (red, green, blue) = HSLColor(index as f64 / count as f64, 0.7, 0.45).rgb();
    RGBColor(red, green, blue)
}

/// Pixels the legend takes per configuration, and its padding.
const LEGEND_ROW_PIXELS: f64 = 19.0;
const LEGEND_PADDING_PIXELS: f64 = 16.0;

/// The top of the value axis: room above the tallest bar for the legend
/// (drawn at the upper right), so it never covers a bar.
fn axis_top(maximum: f64, labels: usize, plot_pixels: f64) -> f64 {
    let legend_pixels = labels as f64 * LEGEND_ROW_PIXELS + LEGEND_PADDING_PIXELS;
    let legend_share = (legend_pixels / plot_pixels).min(0.7);
    maximum * 1.05 / (1.0 - legend_share)
}

const HEIGHT_PIXELS: u32 = 560;
const MINIMUM_WIDTH_PIXELS: u32 = 1100;
const Y_LABEL_PIXELS: u32 = 80;
const NOTE_ROW_PIXELS: u32 = 16;
/// Space kept between two clusters' labels.
const LABEL_GAP_PIXELS: u32 = 24;

/// Under each cluster's name, the seed's posted gain beside this run's.
fn cluster_notes(result: &SeedResult) -> Vec<Option<String>> {
    result
        .groups
        .iter()
        .map(|group| crate::posted::chart_note(result.id, group, result.metric))
        .collect()
}

/// Wide enough that no cluster's name or note runs into its neighbour's:
/// every cluster gets the width of the widest label plus a gap.
fn chart_width(result: &SeedResult, notes: &[Option<String>]) -> u32 {
    let name_font = ("sans-serif", 13).into_font();
    let note_font = ("sans-serif", 12).into_font();
    let widest_name = result
        .groups
        .iter()
        .map(|group| name_font.box_size(&group.name).map_or(0, |(width, _)| width))
        .max()
        .unwrap_or(0);
    let widest_note = notes
        .iter()
        .flatten()
        .map(|note| note_font.box_size(note).map_or(0, |(width, _)| width))
        .max()
        .unwrap_or(0);
    let cluster_pixels = widest_name.max(widest_note) + LABEL_GAP_PIXELS;
    let plot_pixels = cluster_pixels * result.groups.len() as u32;
    (Y_LABEL_PIXELS + 2 * 12 + plot_pixels).max(MINIMUM_WIDTH_PIXELS)
}

/// Draws the chart; returns false (and draws nothing) without a font.
pub fn draw(path: &Path, result: &SeedResult) -> anyhow::Result<bool> {
    if !font_ready() {
        eprintln!(
            "note: no TrueType font found (install fonts-dejavu-core); {} not drawn",
            path.display()
        );
        return Ok(false);
    }
    let mut labels: Vec<String> = Vec::new();
    for group in &result.groups {
        for row in &group.rows {
            if !labels.contains(&row.label) {
                labels.push(row.label.clone());
            }
        }
    }
    let maximum = result
        .groups
        .iter()
        .flat_map(|group| group.rows.iter().map(|row| result.metric.of(row)))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let groups = result.groups.len();
    let notes = cluster_notes(result);
    let note_rows = usize::from(notes.iter().any(Option::is_some));
    let x_label_pixels = 40 + note_rows as u32 * NOTE_ROW_PIXELS;
    let width = chart_width(result, &notes);
    // The plot's own height: the image less caption, margins and x labels.
    let plot_pixels = (HEIGHT_PIXELS - 22 - 2 * 12 - x_label_pixels - 10) as f64;
    let top = axis_top(maximum, labels.len(), plot_pixels);
    let root = BitMapBackend::new(path, (width, HEIGHT_PIXELS)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&result.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(x_label_pixels)
        .y_label_area_size(Y_LABEL_PIXELS)
        .build_cartesian_2d(0f64..groups as f64, 0f64..top)?;
    let names: Vec<String> = result.groups.iter().map(|group| group.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            let index = x.floor() as usize;
            // Label each cluster once, at its middle.
            if (x - index as f64 - 0.5).abs() < 1e-6 {
                names.get(index).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(result.metric.name())
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    let note_style = ("sans-serif", 12)
        .into_font()
        .color(&RGBColor(80, 80, 80))
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (index, note) in notes.iter().enumerate() {
        if let Some(note) = note {
            // Below the cluster's name.
            let (x, y) = chart.backend_coord(&(index as f64 + 0.5, 0.0));
            root.draw(&Text::new(note.clone(), (x, y + 26), note_style.clone()))?;
        }
    }
    let bar_width = 0.8 / labels.len() as f64;
    let mut drawn = BTreeSet::new();
    for (label_index, label) in labels.iter().enumerate() {
        let color = colour(label_index, labels.len());
        let bars: Vec<Rectangle<(f64, f64)>> = result
            .groups
            .iter()
            .enumerate()
            .filter_map(|(group_index, group)| {
                let row = group.rows.iter().find(|row| &row.label == label)?;
                let left = group_index as f64 + 0.1 + label_index as f64 * bar_width;
                Some(Rectangle::new(
                    [(left, 0.0), (left + bar_width * 0.9, result.metric.of(row))],
                    color.filled(),
                ))
            })
            .collect();
        let series = chart.draw_series(bars)?;
        if drawn.insert(label.clone()) {
            series.label(label.clone()).legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_has_a_colour_of_its_own() {
        for count in 1..=24 {
            let colours: BTreeSet<(u8, u8, u8)> = (0..count)
                .map(|index| {
                    let RGBColor(red, green, blue) = colour(index, count);
                    (red, green, blue)
                })
                .collect();
            assert_eq!(colours.len(), count, "{count} configurations");
        }
    }

    fn seed_004_shaped(rows: &[&str]) -> SeedResult {
        let names = [
            "buffered write 4k",
            "buffered write 64k",
            "buffered write 1M",
            "buffered read 4k",
            "buffered read 64k",
            "buffered read 1M",
            "sequential buffered writes + writeback",
        ];
        let groups = names
            .iter()
            .enumerate()
            .map(|(index, name)| crate::results::Group {
                name: name.to_string(),
                command: String::new(),
                rows: rows
                    .iter()
                    .enumerate()
                    .map(|(row_index, label)| crate::results::Row {
                        label: label.to_string(),
                        iops: 0.0,
                        mib_per_second: 1000.0 * (index + row_index + 1) as f64,
                        p99_us: 0.0,
                        write_amplification: None,
                        requests_per_io: None,
                    })
                    .collect(),
            })
            .collect();
        SeedResult {
            id: "004",
            title: "Seed 004: the buffered path with large folios".into(),
            metric: crate::results::Metric::MibPerSecond,
            groups,
            goals: Vec::new(),
        }
    }

    #[test]
    fn no_cluster_label_is_wider_than_its_cluster() {
        assert!(font_ready(), "the chart tests need fonts-dejavu-core");
        let result = seed_004_shaped(&["foliofs", "folio_max=4k"]);
        let notes = cluster_notes(&result);
        let width = chart_width(&result, &notes);
        let cluster_pixels = (width - Y_LABEL_PIXELS - 2 * 12) / result.groups.len() as u32;
        let font = ("sans-serif", 13).into_font();
        for group in &result.groups {
            let (label_pixels, _) = font.box_size(&group.name).unwrap();
            // The longest name here did not fit the old fixed 1,100 pixels.
            assert!(label_pixels + LABEL_GAP_PIXELS <= cluster_pixels, "{}", group.name);
        }
    }

    #[test]
    fn a_chart_is_drawn_with_the_posted_notes() {
        assert!(font_ready(), "the chart tests need fonts-dejavu-core");
        let path =
            std::env::temp_dir().join(format!("foliofs-chart-test-{}.png", std::process::id()));
        let result = seed_004_shaped(&["foliofs", "folio_max=4k", "kernel ext4"]);
        assert!(draw(&path, &result).unwrap());
        let bytes = std::fs::read(&path).unwrap();
        if std::env::var_os("FOLIOFS_KEEP_CHART").is_none() {
            std::fs::remove_file(&path).unwrap();
        }
        assert_eq!(&bytes[1..4], b"PNG");
        // The width field of the PNG header.
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        assert!(width > MINIMUM_WIDTH_PIXELS, "{width} pixels");
    }

    #[test]
    fn the_legend_sits_above_the_tallest_bar() {
        let plot_pixels = 454.0;
        for labels in [1, 4, 8, 12] {
            let top = axis_top(100.0, labels, plot_pixels);
            let legend_pixels = labels as f64 * LEGEND_ROW_PIXELS + LEGEND_PADDING_PIXELS;
            let tallest_bar_pixels = 100.0 / top * plot_pixels;
            assert!(tallest_bar_pixels + legend_pixels <= plot_pixels, "{labels} labels");
        }
    }
}
