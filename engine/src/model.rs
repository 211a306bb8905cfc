//! A loaded GGUF, shared by every role that names the same file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_memory_budget::gguf::{self, GgufHeader};
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;

use crate::backend::{backend, Placement};
use crate::error::LoadError;

/// A model in memory. Roles hold it by `Arc`; it is freed when the last role unloads.
pub struct SharedModel {
    pub model: LlamaModel,
    pub path: PathBuf,
    pub header: GgufHeader,
    pub mmap: bool,
    pub placement: Placement,
    /// The chat template stored in the file, if any.
    pub template: Option<String>,
    /// The text of the vocabulary's control tokens (`<|im_start|>`, `<|im_end|>`, …), longest
    /// first: written in a message, they are escaped (`prompt::escape_controls`).
    pub controls: Vec<String>,
    /// The file as it was read (the prefix files' key); None if it changed during the load.
    pub identity: Option<FileIdentity>,
}

/// What tells one model file from its replacement at the same path: size, modification time,
/// device and inode, read when the model loaded. Read again at each prefix file's write or
/// restore, it was the new file's while the weights in memory were the old one's: a file
/// replaced under a loaded role had the old weights' state written under the new file's key,
/// and every later load of the new file restored it (a stale guard prefix: wrong verdicts).
/// The inode tells a replacement that kept the size and time (`tar`, `cp -p` then `mv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub len: u64,
    pub mtime_ns: u128,
    pub dev: u64,
    pub ino: u64,
}

impl FileIdentity {
    pub fn of(path: &Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        let mtime_ns = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        Some(FileIdentity { len: meta.len(), mtime_ns, dev: meta.dev(), ino: meta.ino() })
    }
}

/// What makes two roles able to share one loaded model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelKey {
    pub path: PathBuf,
    pub mmap: bool,
    pub devices: Vec<usize>,
}

impl ModelKey {
    pub fn new(path: &Path, mmap: bool, placement: &Placement) -> ModelKey {
        // Canonical, so that two spellings of one file still share it.
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        ModelKey { path, mmap, devices: placement.device_indices.clone() }
    }
}

/// The control tokens' texts, and the tag-like user-defined ones' (`<think>`, `</think>`,
/// `<tool_call>`: llama.cpp matches user-defined tokens by their text even when it parses no
/// special token), longest first (one that holds another is escaped first).
fn control_texts(model: &LlamaModel) -> Vec<String> {
    use llama_cpp_2::token_type::LlamaTokenAttr;
    let vocab = model.vocab();
    let tag = |s: &str| s.len() >= 3 && s.starts_with('<') && s.ends_with('>');
    let mut texts: Vec<String> = vocab
        .tokens()
        .filter_map(|t| {
            let text = vocab.text(t).and_then(|c| c.to_str().ok())?;
            let user_tag = vocab.attr(t).contains(LlamaTokenAttr::UserDefined) && tag(text);
            (vocab.is_control(t) || user_tag).then(|| text.to_string())
        })
        // A one-character control text cannot be escaped inside itself (and none is a marker).
        .filter(|s| s.chars().nth(1).is_some())
        .collect();
    texts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    texts.dedup();
    texts
}

impl SharedModel {
    /// Check the header, then load through llama.cpp, reporting progress in 0..=1.
    pub fn load(
        path: &Path,
        mmap: bool,
        placement: Placement,
        progress: Box<dyn FnMut(f32) + Send>,
    ) -> Result<Arc<SharedModel>, LoadError> {
        // A missing, truncated or foreign file fails here with its name, not inside llama.cpp.
        let before = FileIdentity::of(path);
        let header = gguf::read_header(path)?;
        let backend = backend()?;
        let mut progress = progress;
        let mut params = LlamaModelParams::default().with_use_mmap(mmap).with_progress_callback(move |p| {
            progress(p);
            true
        });
        if !placement.device_indices.is_empty() {
            params = params
                .with_devices(&placement.device_indices)
                .map_err(|e| LoadError::Llama { path: path.display().to_string(), reason: e.to_string() })?
                .with_n_gpu_layers(u32::MAX / 2);
        } else {
            params = params.with_n_gpu_layers(0);
        }
        let model = LlamaModel::load_from_file(backend, path, &params).map_err(|e| LoadError::Llama {
            path: path.display().to_string(),
            reason: format!("{e} (the header was valid: the tensors or architecture were refused; RUST_LOG=llama_cpp_2=warn shows llama.cpp's reason)"),
        })?;
        let template = model.chat_template(None).ok().and_then(|t| t.to_string().ok());
        let controls = control_texts(&model);
        // Replaced while it loaded: which file the weights came from is unknown.
        let identity = before.filter(|b| FileIdentity::of(path).as_ref() == Some(b));
        Ok(Arc::new(SharedModel {
            model,
            path: path.to_path_buf(),
            header,
            mmap,
            placement,
            template,
            controls,
            identity,
        }))
    }

    pub fn file_bytes(&self) -> u64 {
        self.header.file_size
    }

    /// Part of its state is recurrent (Mamba, RWKV, Qwen3.5's DeltaNet layers): one state per
    /// sequence, at its end, which cannot be cut back or shared between sequences; rewinding it
    /// needs a checkpoint.
    pub fn recurrent_state(&self) -> bool {
        self.model.is_recurrent() || self.model.is_hybrid()
    }
}
