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

/// One member: its name, byte offset, array extents (outermost first) and scalar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The member's name, lowercased (Rust fields are snake case, some C members capitals).
    pub name: String,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Array extents, outermost first (empty for a scalar).
    pub dims: Vec<usize>,
    /// The element: `'f'` float, `'i'` integer or pointer (Rust mirrors addresses as `u64`),
    /// `'s'` struct; and its size in bytes.
    pub scalar: (char, usize),
}

/// What the check knows of a Rust field's type: its array extents and its element.
pub trait CField {
    /// Array extents, outermost first.
    fn dims() -> Vec<usize> {
        Vec::new()
    }
    /// The element's kind and size, as in [`Field::scalar`].
    fn scalar() -> (char, usize);
}

macro_rules! scalar_fields {
    ($($t:ty => $kind:literal),*) => {$(
        impl CField for $t {
            fn scalar() -> (char, usize) {
                ($kind, std::mem::size_of::<$t>())
            }
        }
    )*};
}
scalar_fields!(f64 => 'f', f32 => 'f', i64 => 'i', u64 => 'i', i32 => 'i', u32 => 'i');

impl<T: CField, const N: usize> CField for [T; N] {
    fn dims() -> Vec<usize> {
        std::iter::once(N).chain(T::dims()).collect()
    }
    fn scalar() -> (char, usize) {
        T::scalar()
    }
}

/// The extents and element of the field `field` selects (lets the macro name its type).
pub fn field_type<T, F: CField>(_field: fn(&T) -> &F) -> (Vec<usize>, (char, usize)) {
    (F::dims(), F::scalar())
}

/// Kind, size and alignment of a C scalar type named in an argument block.
fn scalar(ty: &str) -> Option<(char, usize, usize)> {
    Some(match ty {
        "char" | "u8" | "bool" => ('i', 1, 1),
        "short" | "h16" | "b16" => ('i', 2, 2),
        "int" | "unsigned" | "i32" | "u32" => ('i', 4, 4),
        "float" => ('f', 4, 4),
        "i64" | "u64" | "long" => ('i', 8, 8),
        "double" => ('f', 8, 8),
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
        let decl = decl.trim_start_matches("const ");
        let (ty, declarators) = decl.split_once(char::is_whitespace).ok_or_else(|| format!("cannot read `{decl}`"))?;
        // As in C, `*` belongs to the declarator after it: `char* p, n` is a pointer and a char.
        let type_pointer = ty.ends_with('*');
        let ty = ty.trim_end_matches('*');
        for (i, declarator) in declarators.split(',').map(str::trim).enumerate() {
            let pointer = declarator.starts_with('*') || (i == 0 && type_pointer);
            let (kind, elem, elem_align) = if pointer {
                ('i', 8, 8)
            } else if let Some(s) = scalar(ty) {
                s
            } else {
                let (_, size, align) = parse(source, consts, ty)?;
                ('s', size, align)
            };
            let mut parts = declarator.trim_start_matches('*').split('[');
            let member = parts.next().unwrap_or_default().trim().to_lowercase();
            let mut dims = Vec::new();
            for extent in parts {
                let extent = extent.trim_end_matches(']').trim();
                dims.push(
                    extent
                        .parse::<usize>()
                        .ok()
                        .or_else(|| consts.get(extent).copied())
                        .ok_or_else(|| format!("struct {name}: unknown extent `{extent}`"))?,
                );
            }
            let size = elem * dims.iter().product::<usize>();
            offset = offset.next_multiple_of(elem_align);
            fields.push(Field { name: member, offset, dims, scalar: (kind, elem) });
            offset += size;
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
        let one = |f: &Field| {
            let dims: String = f.dims.iter().map(|d| format!("[{d}]")).collect();
            format!("{}{dims}:{}{}@{}", f.name, f.scalar.0, f.scalar.1, f.offset)
        };
        fields.iter().map(one).collect::<Vec<_>>().join(" ")
    };
    Err(format!(
        "argument block {c_name} differs between Rust and CUDA C:\n  rust ({size} bytes): {}\n  C    ({c_size} bytes): {}",
        show(rust),
        show(&c)
    ))
}

/// The fields of `#[repr(C)]` struct `Rust { fields.. }` (every field, in declaration order).
macro_rules! rust_fields {
    ($rust:ty { $($field:ident),* $(,)? }) => {
        vec![$({
            let (dims, scalar) = $crate::kernels::layout::field_type(|s: &$rust| &s.$field);
            $crate::kernels::layout::Field {
                name: stringify!($field).to_lowercase(),
                offset: std::mem::offset_of!($rust, $field),
                dims,
                scalar,
            }
        }),*]
    };
}
pub(crate) use rust_fields;

/// Assert that `#[repr(C)]` struct `Rust { fields.. }` (every field, in declaration order)
/// has the layout of `struct c_name` in kernel source `source`: names, offsets, array extents
/// and element kinds and sizes.
macro_rules! assert_c_layout {
    ($rust:ty { $($field:ident),* $(,)? }, $source:expr, $c_name:literal) => {{
        let fields = $crate::kernels::layout::rust_fields!($rust { $($field),* });
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
        st: [[i64; 3]; 2],
        e: [Pair; 3],
    }

    #[repr(C)]
    struct Pair {
        a: u64,
        b: i32,
    }

    impl CField for Pair {
        fn scalar() -> (char, usize) {
            ('s', std::mem::size_of::<Pair>())
        }
    }

    const SOURCE: &str = "
        #define N 3
        struct Pair { u64 a; int b; };  // 16 bytes: padded to 8
        struct Block {
            char* p[2];   /* two addresses */
            int n;
            double scale;
            i64 st[2][N];
            Pair e[N];
        };
    ";

    fn block() -> Vec<Field> {
        rust_fields!(Block { p, n, scale, st, e })
    }

    #[test]
    fn a_matching_block_passes() {
        assert_c_layout!(Pair { a, b }, SOURCE, "Pair");
        assert_c_layout!(Block { p, n, scale, st, e }, SOURCE, "Block");
    }

    #[test]
    fn moved_added_retyped_and_reshaped_members_are_caught() {
        let size = std::mem::size_of::<Block>();
        let differs = |source: &str| compare(&block(), size, source, "Block").is_err();
        // Two members swapped on the C side.
        let swapped = SOURCE.replace("int n;\n            double scale;", "double scale;\n            int n;");
        assert!(differs(&swapped));
        // A member of the same size but another kind, an extent, and an array's dims transposed.
        assert!(differs(&SOURCE.replace("double scale;", "i64 scale;")));
        assert!(differs(&SOURCE.replace("#define N 3", "#define N 4")));
        assert!(differs(&SOURCE.replace("i64 st[2][N];", "i64 st[N][2];")));
        // A member only the Rust side has.
        let mut extra = block();
        extra.insert(2, Field { name: "m".into(), offset: 20, dims: vec![], scalar: ('i', 4) });
        assert!(compare(&extra, size, SOURCE, "Block").is_err());
        assert!(compare(&block(), size, SOURCE, "Missing").unwrap_err().contains("no `struct Missing`"));
    }

    #[test]
    fn a_star_belongs_to_its_declarator() {
        let text = "struct S { char *p, n; char* q, m; };";
        let (fields, size, _) = parse(text, &HashMap::new(), "S").unwrap();
        let kinds: Vec<(&str, usize)> = fields.iter().map(|f| (f.name.as_str(), f.scalar.1)).collect();
        assert_eq!(kinds, [("p", 8), ("n", 1), ("q", 8), ("m", 1)]);
        assert_eq!(size, 32);
    }
}
