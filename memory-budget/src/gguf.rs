//! A small GGUF header reader: metadata and tensor infos, no tensor data.
//!
//! Used before llama.cpp ever sees a file, so that a missing, truncated or foreign file gets an
//! error that names the file and says what is wrong, and so that the planner can estimate a
//! model's cost without loading it. Layout: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// Why a file is not a usable GGUF model.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("model file {path} does not exist (tools/fetch-models fetches the default models)")]
    Missing { path: PathBuf },
    #[error("cannot read model file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a GGUF file (starts with {found:?}, expected \"GGUF\")")]
    NotGguf { path: PathBuf, found: String },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path} is truncated: {what}")]
    Truncated { path: PathBuf, what: String },
    #[error("{path}: malformed GGUF header: {what}")]
    Malformed { path: PathBuf, what: String },
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    /// An array of more than [`KEPT_ITEMS`] items (a tokenizer's vocabulary, scores, merges):
    /// read through and checked, but only its length kept. Kept whole, every item took a 32-byte
    /// `Value`: a 256 MiB file of one byte array asked 8 GiB of a 16 GB device at every load.
    LongArray {
        len: u64,
    },
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            Value::Bool(v) => Some(v.into()),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Elements (saturating: [`read_header`] refuses a tensor whose count overflows).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).unwrap_or(u64::MAX)
    }
    /// Bytes of this tensor's data.
    pub fn n_bytes(&self) -> u64 {
        self.ggml_type.bytes_for(self.n_elements())
    }
}

/// A ggml tensor type with its block layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    /// (name, elements per block, bytes per block), from ggml's type traits.
    fn traits(self) -> Option<(&'static str, u64, u64)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 36),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }

    pub fn is_known(self) -> bool {
        self.traits().is_some()
    }

    pub fn name(self) -> String {
        self.traits().map_or_else(|| format!("type{}", self.0), |t| t.0.to_string())
    }

    /// Bytes needed for `n` elements (rounded up to whole blocks; saturating).
    pub fn bytes_for(self, n: u64) -> u64 {
        let (_, block, size) = self.traits().unwrap_or(("?", 1, 4));
        n.div_ceil(block).saturating_mul(size)
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the tensor data section.
    pub data_offset: u64,
    pub file_size: u64,
}

impl GgufHeader {
    /// `general.architecture`, e.g. `llama`, `qwen35`, `gemma3`.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get("general.architecture").and_then(Value::as_str)
    }

    /// An architecture-scoped key, e.g. `arch_u64("block_count")` reads `llama.block_count`.
    pub fn arch_u64(&self, key: &str) -> Option<u64> {
        let arch = self.architecture()?;
        self.metadata.get(&format!("{arch}.{key}")).and_then(Value::as_u64)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// Sum of all tensor data bytes.
    pub fn weights_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorInfo::n_bytes).fold(0, u64::saturating_add)
    }
}

const MAX_STRING: u64 = 64 << 20;
const MAX_ARRAY: u64 = 1 << 28;
/// The longest array kept item by item: per-layer values (at most `MAX_LAYERS`) and other small
/// arrays are; the estimate needs only the length of longer ones.
pub const KEPT_ITEMS: u64 = 1 << 16;
const MAX_DIMS: u32 = 8;

struct Reader<R> {
    inner: R,
    pos: u64,
    path: PathBuf,
    file_size: u64,
}

impl<R: Read> Reader<R> {
    fn err_eof(&self, what: &str) -> GgufError {
        GgufError::Truncated {
            path: self.path.clone(),
            what: format!("header ends inside {what} at byte {} of {}", self.pos, self.file_size),
        }
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        match self.inner.read_exact(&mut buf) {
            Ok(()) => {
                self.pos += N as u64;
                Ok(buf)
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.err_eof(what)),
            Err(source) => Err(GgufError::Io { path: self.path.clone(), source }),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.string_len(what)?;
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf).map_err(|_| self.err_eof(what))?;
        self.pos += len;
        String::from_utf8(buf)
            .map_err(|_| GgufError::Malformed { path: self.path.clone(), what: format!("{what} is not UTF-8") })
    }

    /// A length of `len` bytes or items (each at least a byte) read next: over `max`, not
    /// plausible; past the end of the file, truncated. Added in u64 only once `len` is
    /// plausible (a length of u64::MAX overflowed the sum: a panic in a debug build).
    fn check_len(&self, what: &str, len: u64, max: u64) -> Result<(), GgufError> {
        if len > max {
            return Err(GgufError::Malformed {
                path: self.path.clone(),
                what: format!("{what}: length {len} is not plausible"),
            });
        }
        match self.pos.checked_add(len) {
            Some(end) if end <= self.file_size => Ok(()),
            _ => Err(self.err_eof(what)),
        }
    }

    /// A string's length, checked: what `string` reads, or a long array skips.
    fn string_len(&mut self, what: &str) -> Result<u64, GgufError> {
        let len = self.u64(what)?;
        self.check_len(what, len, MAX_STRING)?;
        Ok(len)
    }

    /// Read past `n` bytes.
    fn skip(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        match io::copy(&mut (&mut self.inner).take(n), &mut io::sink()) {
            Ok(k) if k == n => {
                self.pos += n;
                Ok(())
            }
            Ok(_) => Err(self.err_eof(what)),
            Err(source) => Err(GgufError::Io { path: self.path.clone(), source }),
        }
    }

    fn value(&mut self, ty: u32, what: &str) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(what)?[0]),
            1 => Value::I8(self.bytes::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.bytes(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes(what)?)),
            7 => Value::Bool(self.bytes::<1>(what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 => {
                let item_ty = self.u32(what)?;
                // llama.cpp reads no array of arrays; nested, each level took a stack frame (a
                // 100 KB header of them overflowed the stack and aborted the daemon).
                if item_ty == 9 {
                    return Err(GgufError::Malformed {
                        path: self.path.clone(),
                        what: format!("{what} is an array of arrays"),
                    });
                }
                let len = self.u64(what)?;
                self.check_len(what, len, MAX_ARRAY)?;
                if len > KEPT_ITEMS {
                    // Items of a fixed size are skipped at once; strings one by one (each has
                    // its length), and any other type is checked by reading its first item.
                    match fixed_size(item_ty) {
                        Some(size) => {
                            self.check_len(what, len * size, MAX_ARRAY * 8)?;
                            self.skip(len * size, what)?;
                        }
                        None if item_ty == 8 => {
                            for _ in 0..len {
                                let n = self.string_len(what)?;
                                self.skip(n, what)?;
                            }
                        }
                        None => {
                            self.value(item_ty, what)?;
                        }
                    }
                    return Ok(Value::LongArray { len });
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(item_ty, what)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.bytes(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes(what)?)),
            other => {
                return Err(GgufError::Malformed {
                    path: self.path.clone(),
                    what: format!("{what} has unknown value type {other}"),
                })
            }
        })
    }
}

/// The bytes of one item of a fixed-size value type (None: a string, an array, or unknown).
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Read and check a GGUF header: magic, version, metadata, tensor infos, and that every tensor's
/// data lies inside the file (a truncated download is caught here, not by llama.cpp).
pub fn read_header(path: impl AsRef<Path>) -> Result<GgufHeader, GgufError> {
    let path = path.as_ref().to_path_buf();
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(GgufError::Missing { path }),
        Err(source) => return Err(GgufError::Io { path, source }),
    };
    let file_size = file.metadata().map_err(|source| GgufError::Io { path: path.clone(), source })?.len();
    let mut r = Reader { inner: BufReader::with_capacity(1 << 16, file), pos: 0, path: path.clone(), file_size };

    let magic: [u8; 4] = match r.bytes::<4>("magic") {
        Ok(m) => m,
        Err(GgufError::Truncated { .. }) => {
            return Err(GgufError::NotGguf { path, found: format!("a {file_size}-byte file") })
        }
        Err(e) => return Err(e),
    };
    if &magic != b"GGUF" {
        return Err(GgufError::NotGguf { path, found: String::from_utf8_lossy(&magic).into_owned() });
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version { path, version });
    }
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata count")?;
    if n_tensors > 1 << 20 || n_kv > 1 << 20 {
        return Err(GgufError::Malformed {
            path,
            what: format!("implausible counts: {n_tensors} tensors, {n_kv} metadata keys"),
        });
    }

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key #{i}"))?;
        let ty = r.u32(&format!("type of {key}"))?;
        let value = r.value(ty, &key)?;
        metadata.insert(key, value);
    }

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = r.string(&format!("tensor name #{i}"))?;
        let n_dims = r.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::Malformed { path, what: format!("tensor {name} has {n_dims} dimensions") });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&name)?);
        }
        let ggml_type = GgmlType(r.u32(&name)?);
        if !ggml_type.is_known() {
            return Err(GgufError::Malformed { path, what: format!("tensor {name} has unknown type {}", ggml_type.0) });
        }
        let offset = r.u64(&name)?;
        // Sizes in u64 throughout: a count that overflows it (dims 2^32 x 2^32) wrapped to 0 in
        // a release build, and the tensor passed for an empty one.
        let bytes = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).and_then(|n| {
            let (_, block, size) = ggml_type.traits()?;
            n.div_ceil(block).checked_mul(size)?.checked_add(offset)
        });
        if bytes.is_none() {
            return Err(GgufError::Malformed { path, what: format!("tensor {name}'s size or offset overflows") });
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset });
    }

    // llama.cpp takes a power of two only.
    let alignment = metadata.get("general.alignment").map_or(Some(32), Value::as_u64);
    let Some(alignment) = alignment.filter(|a| a.is_power_of_two() && *a <= 1 << 30) else {
        let what = format!("general.alignment {:?} is not a power of two", metadata.get("general.alignment"));
        return Err(GgufError::Malformed { path, what });
    };
    let data_offset = r.pos.div_ceil(alignment) * alignment;
    let header = GgufHeader { path, version, metadata, tensors, data_offset, file_size };

    // The data section must hold every tensor: the furthest end is the file's minimum size.
    // (Each tensor's offset + bytes was checked above; the data section starts within the file.)
    let end_of = |t: &TensorInfo| header.data_offset.saturating_add(t.offset + t.n_bytes());
    if let Some(last) = header.tensors.iter().max_by_key(|t| end_of(t)) {
        let end = end_of(last);
        if end > file_size {
            return Err(GgufError::Truncated {
                path: header.path,
                what: format!(
                    "tensor {} ends at byte {end} but the file has {file_size} bytes ({} missing)",
                    last.name,
                    end - file_size
                ),
            });
        }
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Write a minimal GGUF v3 file: one u32 key, one string key, one F32 tensor of `n` floats.
    fn tiny_gguf(n: u64, data: bool) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend_from_slice(&(x.len() as u64).to_le_bytes());
            b.extend_from_slice(x.as_bytes());
        };
        s(&mut b, "general.architecture");
        b.extend_from_slice(&8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "llama.block_count");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&30u32.to_le_bytes());
        s(&mut b, "w");
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        if data {
            b.extend(std::iter::repeat_n(0u8, 4 * n as usize));
        }
        f.write_all(&b).unwrap();
        f
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let f = tiny_gguf(16, true);
        let h = read_header(f.path()).unwrap();
        assert_eq!(h.architecture(), Some("llama"));
        assert_eq!(h.arch_u64("block_count"), Some(30));
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.weights_bytes(), 64);
        assert_eq!(h.data_offset % 32, 0);
    }

    #[test]
    fn truncated_data_is_named() {
        let f = tiny_gguf(16, false);
        let e = read_header(f.path()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
        assert!(msg.contains(&f.path().display().to_string()) && msg.contains("64 missing"), "{msg}");
    }

    #[test]
    fn truncated_header_is_named() {
        let full = tiny_gguf(16, true);
        let bytes = std::fs::read(full.path()).unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes[..40]).unwrap();
        let e = read_header(f.path()).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    }

    #[test]
    fn foreign_and_missing_files() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(b"<html>not a model</html>").unwrap();
        let e = read_header(f.path()).unwrap_err();
        assert!(matches!(e, GgufError::NotGguf { .. }) && e.to_string().contains("<htm"), "{e}");
        let e = read_header("/nonexistent/model.gguf").unwrap_err();
        assert!(matches!(e, GgufError::Missing { .. }) && e.to_string().contains("/nonexistent/model.gguf"));
    }

    /// A GGUF v3 file of `kv` (key, type, value bytes) and `tensors` (name, dims, type, offset),
    /// then `data` zero bytes after the aligned header.
    fn gguf(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, u64)], data: usize) -> tempfile::NamedTempFile {
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend_from_slice(&(x.len() as u64).to_le_bytes());
            b.extend_from_slice(x.as_bytes());
        };
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (key, ty, value) in kv {
            s(&mut b, key);
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(value);
        }
        for (name, dims, ty, offset) in tensors {
            s(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.resize(b.len() + data, 0);
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&b).unwrap();
        f
    }

    fn malformed(f: &tempfile::NamedTempFile, says: &str) {
        let e = read_header(f.path()).unwrap_err();
        assert!(matches!(e, GgufError::Malformed { .. }) && e.to_string().contains(says), "{e}");
    }

    /// An array of arrays is refused (as llama.cpp refuses it) before it nests: 20,000 levels,
    /// 240 KB of header, each a stack frame of the reader, overflowed a tokio worker's stack.
    #[test]
    fn nested_arrays_are_refused_at_any_depth() {
        let mut nested = Vec::new();
        for _ in 0..20_000 {
            nested.extend_from_slice(&9u32.to_le_bytes());
            nested.extend_from_slice(&1u64.to_le_bytes());
        }
        nested.extend_from_slice(&4u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
        nested.extend_from_slice(&7u32.to_le_bytes());
        let f = gguf(&[("deep", 9, nested)], &[], 0);
        // The reader on a thread with a tokio worker's stack, as the supervisor calls it.
        let path = f.path().to_path_buf();
        let e = std::thread::Builder::new().stack_size(2 << 20).spawn(move || read_header(path)).unwrap().join();
        let e = e.expect("the reader returned").unwrap_err();
        assert!(matches!(e, GgufError::Malformed { .. }) && e.to_string().contains("array of arrays"), "{e}");
        // An array of numbers is read.
        let mut flat = 4u32.to_le_bytes().to_vec();
        flat.extend_from_slice(&2u64.to_le_bytes());
        flat.extend_from_slice(&[7, 0, 0, 0, 9, 0, 0, 0]);
        let h = read_header(gguf(&[("flat", 9, flat)], &[], 0).path()).unwrap();
        assert_eq!(h.get("flat"), Some(&Value::Array(vec![Value::U32(7), Value::U32(9)])));
    }

    /// A length of u64::MAX is not plausible, for a string or an array: checked against the
    /// file's size first, it overflowed the sum (a panic in a debug build).
    #[test]
    fn lengths_near_u64_max_are_refused() {
        malformed(&gguf(&[("k", 8, u64::MAX.to_le_bytes().to_vec())], &[], 0), "not plausible");
        let mut array = 4u32.to_le_bytes().to_vec();
        array.extend_from_slice(&u64::MAX.to_le_bytes());
        malformed(&gguf(&[("k", 9, array)], &[], 0), "not plausible");
    }

    /// A long array (a vocabulary) keeps its length, not its items: each item was a 32-byte
    /// `Value`, 32 times the file's bytes for an array of bytes. Its items are still read
    /// through: one past the file's end is a truncated header.
    #[test]
    fn long_arrays_keep_their_length_only() {
        let n = KEPT_ITEMS + 1;
        let array = |ty: u32, items: &[u8]| {
            let mut a = ty.to_le_bytes().to_vec();
            a.extend_from_slice(&n.to_le_bytes());
            a.extend_from_slice(items);
            a
        };
        let bytes = array(0, &vec![7u8; n as usize]);
        let word = |w: &str| [(w.len() as u64).to_le_bytes().as_slice(), w.as_bytes()].concat();
        let strings = array(8, &(0..n).flat_map(|_| word("tok")).collect::<Vec<_>>());
        let h = read_header(gguf(&[("b", 9, bytes), ("tokenizer.ggml.tokens", 9, strings.clone())], &[], 0).path())
            .unwrap();
        assert_eq!(h.get("b"), Some(&Value::LongArray { len: n }));
        assert_eq!(h.get("tokenizer.ggml.tokens"), Some(&Value::LongArray { len: n }));
        // Ten strings short (more than the helper's alignment padding): past the file's end.
        let short = &strings[..strings.len() - 10 * word("tok").len()];
        let e = read_header(gguf(&[("tokenizer.ggml.tokens", 9, short.to_vec())], &[], 0).path()).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
        // A string in the array with a length past the file.
        let mut bad = array(8, &word("tok"));
        bad.extend_from_slice(&(1u64 << 20).to_le_bytes());
        let e = read_header(gguf(&[("t", 9, bad)], &[], 0).path()).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    }

    /// Sizes that overflow u64 are refused: dims 2^32 x 2^32 wrapped to 0 elements in a release
    /// build (the tensor passed for an empty one, the truncation check too); an offset near
    /// u64::MAX wrapped its end.
    #[test]
    fn sizes_that_overflow_are_refused() {
        malformed(&gguf(&[], &[("w", &[1 << 32, 1 << 32], 0, 0)], 64), "overflows");
        malformed(&gguf(&[], &[("w", &[u64::MAX, 2], 2, 0)], 64), "overflows");
        malformed(&gguf(&[], &[("w", &[16], 0, u64::MAX - 8)], 64), "overflows");
        // Within u64 but past the file: truncated, and by how much.
        let e = read_header(gguf(&[], &[("w", &[1 << 30, 1 << 30], 0, 0)], 64).path()).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
        let h = read_header(gguf(&[], &[("w", &[4, 4], 0, 0)], 64).path()).unwrap();
        assert_eq!(h.weights_bytes(), 64);
    }

    /// The data section's alignment is a power of two (llama.cpp's rule): 0 divided by zero, and
    /// u64::MAX put the data section past any file.
    #[test]
    fn alignment_is_a_power_of_two() {
        for bad in [0u32, 3, 48] {
            let f = gguf(&[("general.alignment", 4, bad.to_le_bytes().to_vec())], &[("w", &[16], 0, 0)], 64);
            malformed(&f, "general.alignment");
        }
        let f = gguf(&[("general.alignment", 10, u64::MAX.to_le_bytes().to_vec())], &[], 0);
        malformed(&f, "general.alignment");
        let f = gguf(&[("general.alignment", 4, 64u32.to_le_bytes().to_vec())], &[("w", &[16], 0, 0)], 96);
        assert_eq!(read_header(f.path()).unwrap().data_offset % 64, 0);
    }

    #[test]
    fn block_sizes_round_up() {
        assert_eq!(GgmlType::Q4_0.bytes_for(64), 36);
        assert_eq!(GgmlType::Q4_K.bytes_for(256), 144);
        assert_eq!(GgmlType::Q4_0.bytes_for(33), 36);
    }
}
