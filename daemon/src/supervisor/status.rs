//! The status report: every role's state, where it runs and why, what it holds against the
//! budget, its turns and tokens; the speech models; pressure and connections.

use std::sync::atomic::Ordering;

use kazeia_ipc::{ModelState, ModelStatus, StatusReport, PROTOCOL_VERSION};

use super::{RoleState, Supervisor};

impl Supervisor {
    pub fn status(&self) -> StatusReport {
        let roles = self.roles.lock().expect("roles lock").clone();
        let ledger = self.ledger.lock().expect("ledger").clone();
        let models = self
            .config
            .models
            .iter()
            .map(|m| {
                let st = roles.get(&m.role).cloned().unwrap_or(RoleState {
                    state: ModelState::Unloaded,
                    progress: None,
                    error: None,
                });
                let info = self.engine.info(&m.role);
                let placement =
                    info.as_ref().map(|i| i.placement.clone()).unwrap_or_else(|| kazeia_engine::place(m.backend));
                let failed = info.as_ref().and_then(|i| i.failed.clone());
                ModelStatus {
                    role: m.role.clone(),
                    state: if failed.is_some() { ModelState::Failed } else { st.state },
                    file: self.config.model_path(m).display().to_string(),
                    architecture: info.as_ref().map(|i| i.architecture.clone()),
                    file_bytes: info.as_ref().map(|i| i.file_bytes),
                    device: Some(placement.device.clone()),
                    placement: Some(placement.reason.clone()),
                    prefix_file_bytes: info.as_ref().and_then(|i| i.prefix_file.as_ref().map(|(_, b)| *b)),
                    shares_model_with: info.map(|i| i.shares_model_with).unwrap_or_default(),
                    busy: self.engine.pending(&m.role).unwrap_or(0) as u32,
                    turns: self.leased(&m.role) as u32,
                    generated_tokens: self.engine.generated_tokens(&m.role).unwrap_or(0),
                    reserved_bytes: ledger.get(&m.role).map(|e| e.reserved),
                    measured_bytes: ledger.get(&m.role).and_then(|e| e.measured),
                    progress: st.progress,
                    error: failed.or(st.error),
                }
            })
            .collect::<Vec<_>>();
        let mut models = models;
        models.extend(self.speech_status(&ledger));
        StatusReport {
            server: format!("kazeia {}", env!("CARGO_PKG_VERSION")),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            connections: self.connections.load(Ordering::Relaxed),
            turns_running: self.turns_running(),
            pipelines: self.registry.names().map(str::to_string).collect(),
            budget_bytes: ledger.budget,
            pressure: format!("{:?}", self.pressure()).to_lowercase(),
            reserved_bytes: ledger.used(),
            models,
        }
    }
}
