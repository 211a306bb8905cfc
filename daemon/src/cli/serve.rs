//! `kazeia serve`: the daemon on its Unix socket.

use kazeia_pipelines::Registry;

use super::{Exit, ServeArgs};
use crate::config::Config;

pub async fn serve(args: ServeArgs) -> Exit {
    let config = match Config::load(&args.common.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return Exit::Usage;
        }
    };
    let registry = match registry(&args.common, &config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return Exit::Usage;
        }
    };
    match crate::server::serve(config, registry, args.socket).await {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            Exit::Failed
        }
    }
}

/// The built-in pipelines, plus `--pipelines DIR`, whose files name only roles of `config`.
pub fn registry(common: &super::CommonArgs, config: &Config) -> Result<Registry, kazeia_pipelines::PipelineError> {
    let registry = match &common.pipelines {
        Some(dir) => Registry::with_dir(dir)?,
        None => Registry::builtin(),
    };
    let roles = config.models.iter().map(|m| m.role.as_str()).collect::<Vec<_>>().join(", ");
    registry.check_roles(|r| config.model(r).is_ok(), &roles)?;
    Ok(registry)
}
