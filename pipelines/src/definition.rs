//! Pipeline files: a named list of stages. `kazeia run <name>` and a socket turn load the same
//! definitions. The files in this crate's directory are built in; a directory given at run time
//! (`--pipelines DIR`) can add or replace them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// The built-in pipeline files, compiled into the binary so `kazeia run chat` works anywhere.
const BUILTIN: &[(&str, &str)] = &[
    ("chat", include_str!("../chat.toml")),
    ("guarded-chat", include_str!("../guarded-chat.toml")),
    ("guard", include_str!("../guard.toml")),
    ("transcribe", include_str!("../transcribe.toml")),
    ("voice", include_str!("../voice.toml")),
    ("speak", include_str!("../speak.toml")),
];

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("unknown pipeline {name:?} (known: {known})")]
    Unknown { name: String, known: String },
    #[error("pipeline file {file}: {message}")]
    Invalid { file: String, message: String },
    #[error("cannot read pipeline directory {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error("cannot read pipeline file {file}: {source}")]
    File { file: String, source: std::io::Error },
}

/// A stage kind. Each maps to one implementation in [`crate::stages`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Stage {
    /// Generate a reply with the model of `role`, streaming tokens. `thinking_budget`: most
    /// tokens of reasoning in this pipeline (a voice turn wants few), over the role's default;
    /// a turn's `options.thinking_budget` overrides it.
    Think {
        role: String,
        #[serde(default)]
        thinking_budget: Option<u32>,
        /// The Thinker's system prompt, before the conversation. Fixed per pipeline, so the
        /// engine keeps it in the role's prefix file: the first turn after a restart does not
        /// prefill it again.
        #[serde(default)]
        system: Option<String>,
    },
    /// Check the user's text (`input`) or the reply, sentence by sentence (`output`).
    Guard { role: String, check: crate::guard::Check },
    /// The turn's input is audio: VAD to the end of the utterance, then speech to text. Its
    /// transcript is the text the later stages see. (Braces: serde reads any key beside the tag
    /// of a unit variant, so `voice = "fr"` here, a typo for a key that does not exist, passed.)
    Transcribe {},
    /// Speak the text that reaches this stage (the reply's released sentences, or the turn's
    /// own text when no think stage comes before) as audio frames.
    Speak {},
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    #[serde(skip)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Start the Thinker together with the input guard (its tokens are held until the verdict).
    #[serde(default = "yes")]
    pub overlap: bool,
    /// Guard checks reuse the cached KV of their fixed instructions.
    #[serde(default = "yes")]
    pub prefix_cache: bool,
    /// The output guard's first unit is the reply's first clause (cut at `,` `;` `:` after four
    /// words) when it ends before the first sentence: a spoken reply starts sooner.
    #[serde(default)]
    pub first_clause: bool,
    #[serde(rename = "stage")]
    pub stages: Vec<Stage>,
}

fn yes() -> bool {
    true
}

/// A pipeline's stages in the shape the runner executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Audio in: the first stage transcribes.
    pub transcribe: bool,
    pub input_guard: Option<String>,
    pub think: Option<String>,
    /// The think stage's `thinking_budget`.
    pub think_budget: Option<u32>,
    /// The think stage's system prompt.
    pub think_system: Option<String>,
    pub output_guard: Option<String>,
    /// Audio out: the last stage speaks.
    pub speak: bool,
}

impl Plan {
    /// Whether any language-model stage runs (a bare `transcribe` or `speak` has none).
    pub fn has_text_stages(&self) -> bool {
        self.input_guard.is_some() || self.think.is_some()
    }
}

impl Pipeline {
    /// The cascade this pipeline describes: [transcribe] → [guard input] → [think] →
    /// [guard output] → [speak], each at most once and in that order.
    pub fn plan(&self) -> Result<Plan, String> {
        use crate::guard::Check;
        let mut plan = Plan {
            transcribe: false,
            input_guard: None,
            think: None,
            think_budget: None,
            think_system: None,
            output_guard: None,
            speak: false,
        };
        let order = "stages must be: [transcribe] then [guard input] then [think] then [guard output] then [speak], \
                     each at most once";
        let mut stage_no = 0;
        for s in &self.stages {
            let no = match s {
                Stage::Transcribe {} => 1,
                Stage::Guard { check: Check::Input, .. } => 2,
                Stage::Think { .. } => 3,
                Stage::Guard { check: Check::Output, .. } => 4,
                Stage::Speak {} => 5,
            };
            if no <= stage_no {
                return Err(order.into());
            }
            stage_no = no;
            match s {
                Stage::Transcribe {} => plan.transcribe = true,
                Stage::Guard { role, check: Check::Input } => plan.input_guard = Some(role.clone()),
                Stage::Think { role, thinking_budget, system } => {
                    plan.think = Some(role.clone());
                    plan.think_budget = *thinking_budget;
                    plan.think_system = system.clone();
                }
                Stage::Guard { role, check: Check::Output } => plan.output_guard = Some(role.clone()),
                Stage::Speak {} => plan.speak = true,
            }
        }
        if plan.output_guard.is_some() && plan.think.is_none() {
            return Err("an output guard needs a think stage".into());
        }
        Ok(plan)
    }

    /// The model roles this pipeline needs loaded, in stage order, each once.
    pub fn roles(&self) -> Vec<String> {
        let mut roles: Vec<String> = Vec::new();
        for s in &self.stages {
            let (Stage::Think { role, .. } | Stage::Guard { role, .. }) = s else { continue };
            if !roles.contains(role) {
                roles.push(role.clone());
            }
        }
        roles
    }

    pub fn parse(name: &str, file: &str, text: &str) -> Result<Pipeline, PipelineError> {
        let mut p: Pipeline = toml::from_str(text)
            .map_err(|e| PipelineError::Invalid { file: file.to_string(), message: e.to_string() })?;
        if p.stages.is_empty() {
            return Err(PipelineError::Invalid { file: file.to_string(), message: "no [[stage]]".into() });
        }
        p.name = name.to_string();
        p.plan().map_err(|message| PipelineError::Invalid { file: file.to_string(), message })?;
        Ok(p)
    }
}

/// All known pipelines by name.
#[derive(Debug, Clone)]
pub struct Registry {
    pipelines: BTreeMap<String, Pipeline>,
    /// The pipelines read from files: name → file.
    files: BTreeMap<String, String>,
}

impl Registry {
    /// The built-in pipelines.
    pub fn builtin() -> Registry {
        let pipelines = BUILTIN
            .iter()
            .map(|(name, text)| {
                let p =
                    Pipeline::parse(name, &format!("<builtin>/{name}.toml"), text).expect("built-in pipeline parses");
                (name.to_string(), p)
            })
            .collect();
        Registry { pipelines, files: BTreeMap::new() }
    }

    /// The built-ins plus every `*.toml` in `dir` (a file replaces the built-in of its name).
    pub fn with_dir(dir: &Path) -> Result<Registry, PipelineError> {
        let mut reg = Registry::builtin();
        let io = |source| PipelineError::Io { dir: dir.display().to_string(), source };
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let file = path.display().to_string();
            let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_string) else {
                return Err(PipelineError::Invalid { file, message: "the file name is not UTF-8".into() });
            };
            let text =
                std::fs::read_to_string(&path).map_err(|source| PipelineError::File { file: file.clone(), source })?;
            reg.pipelines.insert(name.clone(), Pipeline::parse(&name, &file, &text)?);
            reg.files.insert(name, file);
        }
        Ok(reg)
    }

    /// Every role a pipeline file names is one `is_role` knows (the model set's): a typo
    /// (`thinkr`) was found only when a user's turn on that pipeline failed, `no_model`, with the
    /// daemon up and serving. The built-ins are not checked: a model set may leave out a role
    /// they name (no guard), and their turns say so.
    pub fn check_roles(&self, is_role: impl Fn(&str) -> bool, roles: &str) -> Result<(), PipelineError> {
        for (name, file) in &self.files {
            if let Some(role) = self.pipelines[name].roles().into_iter().find(|r| !is_role(r)) {
                return Err(PipelineError::Invalid {
                    file: file.clone(),
                    message: format!("role {role:?} is no model's in the model set (its roles: {roles})"),
                });
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Result<&Pipeline, PipelineError> {
        self.pipelines.get(name).ok_or_else(|| PipelineError::Unknown {
            name: name.to_string(),
            known: self.pipelines.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.pipelines.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        let reg = Registry::builtin();
        let chat = reg.get("chat").unwrap();
        assert_eq!(chat.stages, vec![Stage::Think { role: "thinker".into(), thinking_budget: None, system: None }]);
        let e = reg.get("nope").unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("chat"), "{e}");
    }

    #[test]
    fn bad_files_are_named() {
        let e = Pipeline::parse("x", "x.toml", "[[stage]]\nkind = \"dance\"\n").unwrap_err().to_string();
        assert!(e.contains("x.toml") && e.contains("dance"), "{e}");
        let e = Pipeline::parse("x", "x.toml", "description = \"d\"\nstage = []\n").unwrap_err().to_string();
        assert!(e.contains("no [[stage]]"), "{e}");
        let out_first = "[[stage]]\nkind = \"guard\"\nrole = \"g\"\ncheck = \"output\"\n[[stage]]\nkind = \"think\"\nrole = \"t\"\n";
        let e = Pipeline::parse("x", "x.toml", out_first).unwrap_err().to_string();
        assert!(e.contains("[guard input] then [think]"), "{e}");
    }

    /// A pipeline file's roles are the model set's; the built-ins' need not be.
    #[test]
    fn a_files_roles_are_checked() {
        let dir = std::env::temp_dir().join(format!("kazeia-pipeline-roles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("typo.toml"), "[[stage]]\nkind = \"think\"\nrole = \"thinkr\"\n").unwrap();
        let reg = Registry::with_dir(&dir).unwrap();
        let e = reg.check_roles(|r| r == "thinker", "thinker").unwrap_err().to_string();
        assert!(e.contains("typo.toml") && e.contains("\"thinkr\"") && e.contains("its roles: thinker"), "{e}");
        reg.check_roles(|r| r == "thinker" || r == "thinkr", "thinker, thinkr").unwrap();
        // `guarded-chat` names a guard this set has not.
        Registry::builtin().check_roles(|r| r == "thinker", "thinker").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A pipeline file that cannot be read is named (the error named only its directory).
    #[test]
    fn an_unreadable_file_is_named() {
        let dir = std::env::temp_dir().join(format!("kazeia-pipelines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("latin1.toml"), b"description = \"caf\xe9\"\n").unwrap();
        let e = Registry::with_dir(&dir).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("latin1.toml"), "{e}");
    }

    #[test]
    fn audio_pipelines_are_files_too() {
        let reg = Registry::builtin();
        let voice = reg.get("voice").unwrap().plan().unwrap();
        assert!(voice.transcribe && voice.speak && voice.think.is_some() && voice.output_guard.is_some());
        let t = reg.get("transcribe").unwrap().plan().unwrap();
        assert!(t.transcribe && !t.speak && !t.has_text_stages());
        let s = reg.get("speak").unwrap().plan().unwrap();
        assert!(s.speak && !s.transcribe && !s.has_text_stages());
        assert!(reg.get("voice").unwrap().roles() == vec!["guard".to_string(), "thinker".to_string()]);
        let late = "[[stage]]\nkind = \"speak\"\n[[stage]]\nkind = \"transcribe\"\n";
        assert!(Pipeline::parse("x", "x.toml", late).is_err());
        // A key these stages do not have is an error, as in the others (it passed unread).
        for typo in
            ["[[stage]]\nkind = \"speak\"\nvoice = \"fr\"\n", "[[stage]]\nkind = \"transcribe\"\nlang = \"fr\"\n"]
        {
            let e = Pipeline::parse("x", "x.toml", typo).unwrap_err().to_string();
            assert!(e.contains("x.toml") && e.contains("unknown field"), "{typo:?}: {e}");
        }
        let e = Pipeline::parse("x", "x.toml", "[[stage]]\nkind = \"think\"\nrole = \"t\"\nrol = \"u\"\n");
        assert!(e.unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn guarded_chat_plan() {
        let reg = Registry::builtin();
        let p = reg.get("guarded-chat").unwrap();
        let plan = p.plan().unwrap();
        assert_eq!(plan.input_guard.as_deref(), Some("guard"));
        assert_eq!(plan.think.as_deref(), Some("thinker"));
        assert_eq!(plan.output_guard.as_deref(), Some("guard"));
        assert!(p.overlap);
        assert_eq!(p.roles(), vec!["guard".to_string(), "thinker".to_string()]);
        let g = reg.get("guard").unwrap().plan().unwrap();
        assert!(g.think.is_none() && g.input_guard.is_some());
    }
}
