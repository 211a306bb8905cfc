//! A role's shared prefix (a guard's instructions), kept on disk so that it survives a restart.
//!
//! Android kills idle services and the daemon unloads idle roles: after each load the guard's
//! instructions were prefilled again before the first verdict (0.67 s of a first guarded turn's
//! 0.85 s here; ~10 s for a 4B guard on the device's CPU). The engine writes the sequence's state
//! once it holds exactly the role's fixed opening (a guard's instructions, up to the checked
//! text: never a user's words), and restores it when the role loads.
//!
//! Safety first: the file is named by a key over everything the state depends on (the model
//! file's path, size, mtime and inode as it was when the weights were read, the context's shape
//! and KV types, the template, llama.cpp's build) and carries the key, the tokens and a SHA-256 of the state. A missing, stale,
//! truncated or corrupt file means a normal prefill and a log line, never a wrong verdict: the
//! state is handed to llama.cpp only after every check passed, and the restored tokens only
//! count where a prompt matches them exactly (the prefix cache compares tokens).

use std::io::Write;
use std::path::{Path, PathBuf};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::LlamaStateSeqFlags;
use sha2::{Digest, Sha256};

use crate::model::SharedModel;
use crate::params::RoleParams;

const MAGIC: &[u8; 8] = b"KZPFX\0\0\x01";
/// Largest state written (a 4B guard's 2k-token prefix is ~150 MiB of KV at f16).
const MAX_BYTES: usize = 512 << 20;
/// Files kept per role, the most recently used: one per key (model, context shape, template,
/// build) in use. With one file per role, any other configuration's daemon, a test's or a
/// `kazeia run --config`, removed the default's: the next start prefilled the guard's
/// instructions again (seen: a first voice turn's input check 1055-1325 ms instead of ~200, in
/// 4 of 7 bench-voice runs after test runs). Bounded: at most this many times `MAX_BYTES`.
const KEEP_PER_ROLE: usize = 4;
/// A role's other files unused this long go at its next write: on the device, where one
/// configuration runs, a model or llama.cpp update leaves the old key's file behind (a 4B
/// guard's: tens to hundreds of MiB).
const MAX_IDLE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// A file's name is `<role>-<the key's first KEY_BYTES, in hex>.prefix`.
const KEY_BYTES: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum PrefixFileError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: {1}")]
    Invalid(String, &'static str),
}

/// Where this role's prefix lives, named by its key, and the key (also inside the file: a file
/// copied or renamed under another key's name is refused); None when the role keeps none.
pub fn path(cfg: &RoleParams, model: &SharedModel) -> Option<(PathBuf, [u8; 32])> {
    let dir = cfg.prefix_dir.as_ref()?;
    // The file the weights were read from, as it was then (not as it is now).
    let id = model.identity?;
    let key = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}",
        model.path.display(),
        id.len,
        id.mtime_ns,
        id.dev,
        id.ino,
        cfg.n_ctx,
        cfg.n_batch,
        cfg.n_ubatch,
        cfg.type_k,
        cfg.type_v,
        cfg.flash_attn,
        cfg.cache_slots,
        cfg.chat_template.as_deref().or(model.template.as_deref()).unwrap_or(""),
        env!("CARGO_PKG_VERSION"),
    );
    let hash = Sha256::digest(format!("{key}|{}", llama_build()).as_bytes());
    let name: String = hash[..KEY_BYTES].iter().map(|b| format!("{b:02x}")).collect();
    Some((dir.join(format!("{}-{name}.prefix", file_safe(&cfg.role))), hash.into()))
}

/// The llama.cpp bindings pinned in the workspace's Cargo.toml (a test keeps them equal): its
/// state layout may change between versions.
const LLAMA_CPP_SYS: &str = "0.1.161";

/// llama.cpp's build, part of the key: the pinned version and the CPU features it uses. Read
/// once per process: `llama_print_system_info` rebuilds a static std::string on every call, so
/// two threads calling it at once (status on one, a worker on another) corrupted the heap
/// (seen: "corrupted size vs. prev_size", SIGABRT, in the admission tests).
fn llama_build() -> &'static str {
    static BUILD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILD.get_or_init(|| {
        // SAFETY: called once (OnceLock); the returned string is copied before any other call.
        let info = unsafe { std::ffi::CStr::from_ptr(llama_cpp_sys_2::llama_print_system_info()) };
        format!("{LLAMA_CPP_SYS} {}", info.to_string_lossy())
    })
}

/// Role names come from the config; keep them to a harmless file-name alphabet.
fn file_safe(role: &str) -> String {
    role.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).take(64).collect()
}

/// Write sequence `seq` (holding exactly `tokens`) to `path`; the role keeps its
/// `KEEP_PER_ROLE` most recently used files.
pub fn save(
    ctx: &LlamaContext<'_>,
    seq: i32,
    tokens: &[LlamaToken],
    path: &Path,
    key: &[u8; 32],
) -> Result<usize, PrefixFileError> {
    let show = path.display().to_string();
    let flags = LlamaStateSeqFlags::empty();
    let size = ctx.state_seq_get_size_ext(seq, flags);
    if size == 0 || size > MAX_BYTES {
        return Err(PrefixFileError::Invalid(show, "state too large to keep"));
    }
    let mut state = vec![0u8; size];
    // SAFETY: `state` holds the size llama.cpp just reported for this sequence.
    let n = unsafe { ctx.state_seq_get_data_ext(state.as_mut_ptr(), seq, flags) };
    if n != size {
        return Err(PrefixFileError::Invalid(show, "llama.cpp wrote a different size than it announced"));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| PrefixFileError::Io(dir.display().to_string(), e))?;
    evict(path, KEEP_PER_ROLE - 1);
    // Written aside, then renamed: a reader never sees half a file, and two writers (two
    // engines in one process, or two processes) never write into the same one.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("prefix.{}-{n}.tmp", std::process::id()));
    let io = |e| PrefixFileError::Io(tmp.display().to_string(), e);
    // Removed on any failure below (a full disk, a rename refused): each load could leave one
    // (up to MAX_BYTES), and eviction counted only finished files.
    let unfinished = Unfinished(&tmp);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    f.write_all(MAGIC).map_err(io)?;
    f.write_all(key).map_err(io)?;
    f.write_all(&(tokens.len() as u32).to_le_bytes()).map_err(io)?;
    for t in tokens {
        f.write_all(&t.0.to_le_bytes()).map_err(io)?;
    }
    f.write_all(&(state.len() as u64).to_le_bytes()).map_err(io)?;
    f.write_all(&checksum(tokens, &state)).map_err(io)?;
    f.write_all(&state).map_err(io)?;
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| PrefixFileError::Io(show, e))?;
    std::mem::forget(unfinished);
    Ok(state.len())
}

/// A file being written: removed unless the write finished (then forgotten).
struct Unfinished<'a>(&'a Path);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// A file being written by a process killed before its end (the Android low-memory killer, a
/// power cut) stays; one of the role's this old is no write still under way (a write takes
/// seconds), and goes at the role's next write.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(600);

/// Remove the role's files other than `path` past the `keep` most recently used (newest
/// modification time first: a restore touches its file), and those unused for `MAX_IDLE`.
fn evict(path: &Path, keep: usize) {
    let dir = path.parent().unwrap_or(Path::new("."));
    let Some(role) =
        path.file_name().and_then(|n| n.to_str()).and_then(|n| n.rsplit_once('-')).map(|(r, _)| format!("{r}-"))
    else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let modified = |e: &std::fs::DirEntry| e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
    let entries: Vec<std::fs::DirEntry> = entries.flatten().collect();
    for e in &entries {
        // `<role>-<key hex>.prefix.<pid>-<n>.tmp`, left by a write that never ended.
        let name = e.file_name().to_string_lossy().into_owned();
        let unfinished = name
            .strip_prefix(&role)
            .and_then(|k| k.get(2 * KEY_BYTES..))
            .is_some_and(|rest| rest.starts_with(".prefix.") && rest.ends_with(".tmp"));
        if unfinished && modified(e).elapsed().is_ok_and(|d| d > STALE_TMP) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let mut others: Vec<(std::time::SystemTime, PathBuf)> = entries
        .into_iter()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // This role's only: after `<role>-`, exactly a key's hex digits (the files of a role
            // named `guard-2` are not `guard`'s).
            name.strip_prefix(&role)
                .is_some_and(|k| k.len() == 2 * KEY_BYTES + ".prefix".len() && k.ends_with(".prefix"))
                && e.path() != path
        })
        .map(|e| (modified(&e), e.path()))
        .collect();
    others.sort_by_key(|o| std::cmp::Reverse(o.0));
    let idle = |at: std::time::SystemTime| at.elapsed().is_ok_and(|d| d > MAX_IDLE);
    for (n, (at, old)) in others.into_iter().enumerate() {
        if n >= keep || idle(at) {
            let _ = std::fs::remove_file(old);
        }
    }
}

/// Mark the file `restore` read as just used, so that the role's other keys are evicted before
/// it: through the descriptor it read (opening the path again, without O_NONBLOCK and
/// O_NOFOLLOW, could block on a FIFO put there meanwhile, or follow a link).
fn touch(file: &std::fs::File) {
    let _ = file.set_modified(std::time::SystemTime::now());
}

/// Read `path` and restore it into sequence `seq`: the tokens it holds now.
pub fn restore(
    ctx: &mut LlamaContext<'_>,
    seq: i32,
    path: &Path,
    key: &[u8; 32],
) -> Result<Vec<LlamaToken>, PrefixFileError> {
    let show = path.display().to_string();
    let bad = |why| PrefixFileError::Invalid(show.clone(), why);
    // Only a regular file of a size one could have: a FIFO there blocked the role's thread
    // for good (loaded, never answering), a huge file or a link to /dev/zero took the memory.
    // Opened without blocking or following a link, then judged by what was opened (a check of
    // the path before opening it could be raced).
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(bad("a symbolic link")),
        Err(e) => return Err(PrefixFileError::Io(show.clone(), e)),
    };
    let meta = file.metadata().map_err(|e| PrefixFileError::Io(show.clone(), e))?;
    if !meta.is_file() {
        return Err(bad("not a regular file"));
    }
    let largest = MAGIC.len() + 32 + 4 + 4 * ctx.n_ctx() as usize + 8 + 32 + MAX_BYTES;
    if meta.len() > largest as u64 {
        return Err(bad("larger than any prefix file"));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(&file, largest as u64 + 1), &mut bytes)
        .map_err(|e| PrefixFileError::Io(show.clone(), e))?;
    if bytes.len() > largest {
        return Err(bad("larger than any prefix file"));
    }
    let mut r = Reader(&bytes);
    if r.take(MAGIC.len()).ok_or(bad("truncated"))? != MAGIC {
        return Err(bad("not a prefix file of this version"));
    }
    if r.array::<32>().ok_or(bad("truncated"))? != *key {
        return Err(bad("made for another model, context or build (stale)"));
    }
    let n = u32::from_le_bytes(r.array().ok_or(bad("truncated"))?) as usize;
    if n == 0 || n > ctx.n_ctx() as usize {
        return Err(bad("token count out of range"));
    }
    let mut tokens = Vec::with_capacity(n);
    for _ in 0..n {
        tokens.push(LlamaToken(i32::from_le_bytes(r.array().ok_or(bad("truncated"))?)));
    }
    let len = u64::from_le_bytes(r.array().ok_or(bad("truncated"))?) as usize;
    let sum: [u8; 32] = r.array().ok_or(bad("truncated"))?;
    let state = r.take(len).ok_or(bad("truncated"))?;
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    if checksum(&tokens, state) != sum {
        return Err(bad("checksum mismatch (corrupt)"));
    }
    // SAFETY: these bytes are a state llama.cpp wrote for a context of the same key (model file,
    // shape, types, build), verified intact by their SHA-256.
    let ok = unsafe { ctx.state_seq_set_data_ext(state, seq, LlamaStateSeqFlags::empty()) };
    if !ok {
        let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
        return Err(bad("llama.cpp refused the state"));
    }
    touch(&file);
    Ok(tokens)
}

/// SHA-256 over the tokens and the state: a file whose tokens or state changed is refused.
fn checksum(tokens: &[LlamaToken], state: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.0.to_le_bytes());
    }
    h.update(state);
    h.finalize().into()
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).map(|s| s.try_into().expect("N bytes"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pinned_llama_cpp_is_the_one_in_the_key() {
        // Read when the test runs: a file outside the package, built in, is tracked at the
        // first clone's path by the shared build cache.
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test");
        let manifest = std::fs::read_to_string(std::path::Path::new(&dir).join("../Cargo.toml")).unwrap();
        assert!(manifest.contains(&format!("llama-cpp-sys-2 = \"={}\"", super::LLAMA_CPP_SYS)), "update LLAMA_CPP_SYS");
    }

    #[test]
    fn role_names_become_harmless_file_names() {
        assert_eq!(super::file_safe("guard"), "guard");
        assert_eq!(super::file_safe("../../etc/x\u{0}"), "______etc_x_");
    }
}
