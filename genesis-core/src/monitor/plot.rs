//! Metric curves as a PNG: one panel per metric, with its name, last value, value range and
//! step range written in the built-in pixel font.

use super::font::{text_height, text_pixels, text_width};
use super::MetricsLog;
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

const PANEL_HEIGHT: u32 = 240;
const WIDTH: u32 = 800;
const SCALE: i32 = 2;
const COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];

/// A short label for a number: up to 4 significant digits, exponent form when very large
/// or small.
fn label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        return format!("{v:.2e}");
    }
    let digits = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_text(area: &Area, text: &str, x: i32, y: i32) -> Result<()> {
    for (px, py) in text_pixels(text, x, y, SCALE) {
        area.draw(&Rectangle::new([(px, py), (px + SCALE - 1, py + SCALE - 1)], BLACK.filled())).map_err(plot_err)?;
    }
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> Error {
    Error::invalid(format!("plot_png: drawing failed: {e}"))
}

impl MetricsLog {
    /// Draw every metric against its step into the PNG file at `path` (one panel per metric,
    /// stacked). The file name must end in `.png`.
    pub fn plot_png(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() != Some("png") {
            return Err(Error::invalid(format!("plot_png: {} does not end in .png", path.display())));
        }
        if self.names.is_empty() {
            return Err(Error::invalid(format!("plot_png: nothing recorded to draw into {}", path.display())));
        }
        let height = PANEL_HEIGHT * self.names.len() as u32;
        let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((self.names.len(), 1));
        for (i, (name, panel)) in self.names.iter().zip(&panels).enumerate() {
            self.draw_panel(panel, name, COLORS[i % COLORS.len()])?;
        }
        root.present().map_err(|e| Error::invalid(format!("plot_png: writing {}: {e}", path.display())))
    }

    fn draw_panel(&self, panel: &Area, name: &str, color: RGBColor) -> Result<()> {
        let points: Vec<(f64, f64)> =
            self.series(name).into_iter().filter(|(_, v)| v.is_finite()).map(|(s, v)| (s as f64, v)).collect();
        let (w, h) = panel.dim_in_pixel();
        let (w, h) = (w as i32, h as i32);
        let (left, right, top, bottom) = (110, 20, 12 + text_height(SCALE) + 10, text_height(SCALE) + 16);
        let last = points.last().map_or("no finite values".to_string(), |p| format!("last {}", label(p.1)));
        draw_text(panel, &format!("{name}   {last}"), left, 10)?;
        let Some(&(x0, _)) = points.first() else { return Ok(()) };
        let x1 = points.last().map_or(x0, |p| p.0);
        let (mut y0, mut y1) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        if y1 - y0 < 1e-12 * y0.abs().max(1.0) {
            let pad = 0.1 * y0.abs().max(1e-3);
            (y0, y1) = (y0 - pad, y1 + pad);
        }
        let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
        let plot = panel.margin(top as u32, bottom as u32, left as u32, right as u32);
        let (pw, ph) = plot.dim_in_pixel();
        plot.draw(&Rectangle::new([(0, 0), (pw as i32 - 1, ph as i32 - 1)], BLACK)).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&plot).build_cartesian_2d(x0..x1, y0..y1).map_err(plot_err)?;
        let grid = RGBColor(225, 225, 225);
        for k in 1..4 {
            let y = y0 + (y1 - y0) * k as f64 / 4.0;
            chart.draw_series(LineSeries::new([(x0, y), (x1, y)], grid)).map_err(plot_err)?;
        }
        chart.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2))).map_err(plot_err)?;
        // Value range at the left, step range below, in panel pixels.
        let right_align = |t: &str| left - 8 - text_width(t, SCALE);
        let (hi, lo) = (label(y1), label(y0));
        draw_text(panel, &hi, right_align(&hi), top)?;
        draw_text(panel, &lo, right_align(&lo), h - bottom - text_height(SCALE))?;
        let (first, end) = (format!("step {}", label(x0)), label(x1));
        draw_text(panel, &first, left, h - bottom + 6)?;
        draw_text(panel, &end, w - right - text_width(&end, SCALE), h - bottom + 6)?;
        Ok(())
    }
}
