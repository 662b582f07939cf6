//! Printing tensors the way PyTorch does: `tensor([[1., 2.], [3., 4.]], dtype=...)`.

use super::Tensor;
use genesis_backend_api::DType;
use std::fmt;

/// Above this many elements, print the first and last few of each dim.
const SUMMARIZE_ABOVE: usize = 1000;
const EDGE_ITEMS: usize = 3;

struct Style {
    integral: bool,
    scientific: bool,
    float: bool,
    boolean: bool,
}

impl Style {
    fn of(values: &[f64], dtype: DType) -> Style {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let max = finite.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let min_nonzero = finite.iter().filter(|v| **v != 0.0).fold(f64::INFINITY, |m, v| m.min(v.abs()));
        Style {
            integral: finite.iter().all(|v| v.fract() == 0.0),
            scientific: max >= 1e8 || (min_nonzero < 1e-4 && min_nonzero.is_finite()),
            float: dtype.is_float(),
            boolean: dtype == DType::Bool,
        }
    }

    fn format(&self, v: f64) -> String {
        if self.boolean {
            return if v != 0.0 { "True".into() } else { "False".into() };
        }
        if !self.float {
            return format!("{}", v as i64);
        }
        if v.is_nan() {
            return "nan".into();
        }
        if v.is_infinite() {
            return if v > 0.0 { "inf".into() } else { "-inf".into() };
        }
        if self.scientific {
            format!("{v:.4e}")
        } else if self.integral {
            format!("{v:.0}.")
        } else {
            format!("{v:.4}")
        }
    }
}

fn write_dim(
    out: &mut String,
    values: &[f64],
    shape: &[usize],
    style: &Style,
    width: usize,
    indent: usize,
    summarize: bool,
) {
    if shape.is_empty() {
        out.push_str(&format!("{:>width$}", style.format(values[0])));
        return;
    }
    let n = shape[0];
    let inner: usize = shape[1..].iter().product();
    let indices: Vec<Option<usize>> = if summarize && n > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS).map(Some).chain([None]).chain((n - EDGE_ITEMS..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    out.push('[');
    for (k, i) in indices.iter().enumerate() {
        if k > 0 {
            out.push(',');
            if shape.len() > 1 {
                out.push_str(&"\n".repeat(shape.len() - 1));
                out.push_str(&" ".repeat(indent + 1));
            } else {
                out.push(' ');
            }
        }
        match i {
            Some(i) => {
                write_dim(out, &values[i * inner..(i + 1) * inner], &shape[1..], style, width, indent + 1, summarize)
            }
            None => out.push_str("..."),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = match self.to_vec::<f64>() {
            Ok(v) => v,
            Err(e) => return write!(f, "tensor(<unreadable: {e}>)"),
        };
        let style = Style::of(&values, self.dtype());
        let width = values.iter().map(|&v| style.format(v).len()).max().unwrap_or(0);
        let mut body = String::new();
        if self.numel() == 0 {
            body.push_str("[]");
        } else {
            write_dim(&mut body, &values, self.shape(), &style, width, "tensor(".len(), self.numel() > SUMMARIZE_ABOVE);
        }
        write!(f, "tensor({body}")?;
        if self.numel() == 0 && self.rank() > 1 {
            write!(f, ", size={:?}", self.shape())?;
        }
        let default_dtype = matches!(self.dtype(), DType::F32 | DType::I64 | DType::Bool);
        if !default_dtype {
            write!(f, ", dtype={}", self.dtype())?;
        }
        if self.device().backend().name() != "cpu" {
            write!(f, ", device='{}'", self.device())?;
        }
        if let Some(name) = self.grad_fn_name() {
            write!(f, ", grad_fn=<{name}>")?;
        } else if self.requires_grad() {
            write!(f, ", requires_grad=True")?;
        }
        write!(f, ")")
    }
}
