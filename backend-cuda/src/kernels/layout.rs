//! Test support: the layout of a C struct read from a kernel source, to check each
//! `#[repr(C)]` argument block a launcher passes by value against the struct its kernels
//! declare. A kernel reads its parameter with the C layout, so a field added, dropped or moved
//! on one side only would silently feed kernels wrong addresses; these checks make it a test
//! failure instead (they need no GPU).
//!
//! The reader knows what the argument blocks use: scalar and pointer members, arrays whose
//! extents are numbers or `#define`d constants, several declarators per line, and members of
//! other structs of the same source. Offsets follow the C rules (natural alignment, the struct
//! padded to its largest member's alignment).

use std::collections::HashMap;

/// One member: its name, byte offset and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The member's name, lowercased (Rust fields are snake case, some C members capitals).
    pub name: String,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Bytes, arrays included.
    pub size: usize,
}

/// Size and alignment of a C type named in an argument block.
fn scalar(ty: &str) -> Option<(usize, usize)> {
    Some(match ty {
        "char" | "u8" | "bool" => (1, 1),
        "short" | "h16" | "b16" => (2, 2),
        "int" | "unsigned" | "float" | "i32" | "u32" => (4, 4),
        "double" | "i64" | "u64" | "long" => (8, 8),
        _ => return None,
    })
}

fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("/") {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        if tail.starts_with("//") {
            rest = tail.find('\n').map_or("", |end| &tail[end..]);
        } else if tail.starts_with("/*") {
            rest = tail.find("*/").map_or("", |end| &tail[end + 2..]);
        } else {
            out.push('/');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// `#define NAME <integer>` constants of a source.
fn defines(source: &str) -> HashMap<String, usize> {
    let mut map = HashMap::new();
    for line in source.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("#define") {
            if let (Some(name), Some(value)) = (words.next(), words.next()) {
                if let Ok(v) = value.trim_start_matches('(').trim_end_matches(')').parse() {
                    map.insert(name.to_string(), v);
                }
            }
        }
    }
    map
}

/// The members, size and alignment of `struct name` in `source` (comments removed).
fn parse(source: &str, consts: &HashMap<String, usize>, name: &str) -> Result<(Vec<Field>, usize, usize), String> {
    let head = format!("struct {name} ");
    let start = source.find(&head).ok_or_else(|| format!("no `struct {name}` in the kernel source"))?;
    let open = start + source[start..].find('{').ok_or_else(|| format!("struct {name} has no body"))?;
    let close = open + source[open..].find('}').ok_or_else(|| format!("struct {name} is not closed"))?;
    let (mut fields, mut offset, mut align) = (Vec::new(), 0usize, 1usize);
    for decl in source[open + 1..close].split(';').map(str::trim).filter(|d| !d.is_empty()) {
        let pointer = decl.contains('*');
        let decl = decl.replace('*', " ");
        let decl = decl.trim_start_matches("const ");
        let (ty, declarators) = decl.split_once(char::is_whitespace).ok_or_else(|| format!("cannot read `{decl}`"))?;
        let (elem, elem_align) = if pointer {
            (8, 8)
        } else if let Some(s) = scalar(ty) {
            s
        } else {
            let (_, size, align) = parse(source, consts, ty)?;
            (size, align)
        };
        for declarator in declarators.split(',').map(str::trim) {
            let mut parts = declarator.split('[');
            let member = parts.next().unwrap_or_default().trim().to_lowercase();
            let mut count = 1;
            for extent in parts {
                let extent = extent.trim_end_matches(']').trim();
                count *= extent
                    .parse::<usize>()
                    .ok()
                    .or_else(|| consts.get(extent).copied())
                    .ok_or_else(|| format!("struct {name}: unknown extent `{extent}`"))?;
            }
            offset = offset.next_multiple_of(elem_align);
            fields.push(Field { name: member, offset, size: elem * count });
            offset += elem * count;
            align = align.max(elem_align);
        }
    }
    Ok((fields, offset.next_multiple_of(align), align))
}

/// Compare a Rust mirror (`fields` in declaration order, `size` its `size_of`) with
/// `struct c_name` of `source`; the error lists both layouts.
pub fn compare(rust: &[Field], size: usize, source: &str, c_name: &str) -> Result<(), String> {
    let text = strip_comments(source);
    let (c, c_size, _) = parse(&text, &defines(&text), c_name)?;
    if c == rust && c_size == size {
        return Ok(());
    }
    let show = |fields: &[Field]| {
        fields.iter().map(|f| format!("{}@{}+{}", f.name, f.offset, f.size)).collect::<Vec<_>>().join(" ")
    };
    Err(format!(
        "argument block {c_name} differs between Rust and CUDA C:\n  rust ({size} bytes): {}\n  C    ({c_size} bytes): {}",
        show(rust),
        show(&c)
    ))
}

/// The size of the field `field` selects (lets the layout macro name a field's type).
pub fn field_size<T, F>(_field: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

/// Assert that `#[repr(C)]` struct `Rust { fields.. }` (every field, in declaration order)
/// has the layout of `struct c_name` in kernel source `source`.
macro_rules! assert_c_layout {
    ($rust:ty { $($field:ident),* $(,)? }, $source:expr, $c_name:literal) => {{
        let fields = [$($crate::kernels::layout::Field {
            name: stringify!($field).to_lowercase(),
            offset: std::mem::offset_of!($rust, $field),
            size: $crate::kernels::layout::field_size(|s: &$rust| &s.$field),
        }),*];
        let checked = $crate::kernels::layout::compare(&fields, std::mem::size_of::<$rust>(), &$source, $c_name);
        if let Err(e) = checked {
            panic!("{e}");
        }
    }};
}
pub(crate) use assert_c_layout;

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct Block {
        p: [u64; 2],
        n: i32,
        scale: f64,
        e: [Pair; 3],
    }

    #[repr(C)]
    struct Pair {
        a: u64,
        b: i32,
    }

    const SOURCE: &str = "
        #define N 3
        struct Pair { u64 a; int b; };  // 16 bytes: padded to 8
        struct Block {
            char* p[2];   /* two addresses */
            int n;
            double scale;
            Pair e[N];
        };
    ";

    #[test]
    fn a_matching_block_passes() {
        assert_c_layout!(Pair { a, b }, SOURCE, "Pair");
        assert_c_layout!(Block { p, n, scale, e }, SOURCE, "Block");
    }

    #[test]
    fn moved_added_and_resized_members_are_caught() {
        let rust = |names: &[(&str, usize, usize)]| -> Vec<Field> {
            names.iter().map(|&(n, o, s)| Field { name: n.into(), offset: o, size: s }).collect()
        };
        let good = rust(&[("p", 0, 16), ("n", 16, 4), ("scale", 24, 8), ("e", 32, 48)]);
        assert!(compare(&good, 80, SOURCE, "Block").is_ok());
        // Two members of the same type swapped on the C side.
        let swapped = SOURCE.replace("int n;\n            double scale;", "double scale;\n            int n;");
        let e = compare(&good, 80, &swapped, "Block").unwrap_err();
        assert!(e.contains("scale@16+8"), "{e}");
        // A member only the Rust side has, and an array extent that differs.
        let extra = rust(&[("p", 0, 16), ("n", 16, 4), ("m", 20, 4), ("scale", 24, 8), ("e", 32, 48)]);
        assert!(compare(&extra, 80, SOURCE, "Block").is_err());
        assert!(compare(&good, 80, &SOURCE.replace("#define N 3", "#define N 4"), "Block").is_err());
        assert!(compare(&good, 80, SOURCE, "Missing").unwrap_err().contains("no `struct Missing`"));
    }
}
