//! One PNG bar chart per seed (plotters): a cluster of bars per shape, one
//! bar per configuration, in the seed's metric. Text needs a TrueType font;
//! the system's DejaVu Sans (Debian's fonts-dejavu-core) is loaded at run
//! time, and without one the chart is skipped with a note.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::seeds::SeedResult;

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
    // The plot's own height: the image less caption, margins and x labels.
    let plot_pixels = 560.0 - 22.0 - 2.0 * 12.0 - 40.0 - 10.0;
    let top = axis_top(maximum, labels.len(), plot_pixels);
    let root = BitMapBackend::new(path, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&result.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
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
