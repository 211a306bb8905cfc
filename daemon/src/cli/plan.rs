//! `kazeia plan`: what the configured models will cost and where they will run, from their
//! file headers; loads nothing.

use kazeia_ipc::ErrorCode;

use super::{CommonArgs, Exit, Printer};
use crate::config::Config;

pub fn plan(common: &CommonArgs, json: bool) -> Exit {
    let printer = Printer::new(json);
    let config = match Config::load(&common.config) {
        Ok(c) => c,
        Err(e) => {
            printer.error(ErrorCode::BadConfig, e.to_string());
            return Exit::Usage;
        }
    };
    match crate::plan::plan(&config) {
        Ok(p) => {
            if json {
                // Tagged like every other `--json` line (`"type": "plan"`).
                let mut v = serde_json::to_value(&p).expect("plan serializes");
                v.as_object_mut().expect("an object").insert("type".into(), "plan".into());
                super::print::json_line(v);
            } else {
                crate::plan::print(&p);
            }
            if p.fits {
                Exit::Ok
            } else {
                Exit::DoesNotFit
            }
        }
        Err(e) => {
            printer.error(ErrorCode::ModelFile, e);
            Exit::Failed
        }
    }
}
