//! A sandbox's display (the `vm` kind's): its screen as a PNG and
//! keyboard and pointer input. Kinds without one answer 409.

use crate::lifecycle::ensure_running;
use crate::{ops, ApiError, ApiResult, Daemon};
use shoal_api::InputEvent as Event;
use shoal_runtime::backend::qemu_input::{self, InputEvent};
use shoal_runtime::backend::{BackendError, Kind, SandboxVm};
use std::sync::Arc;

/// Whether sandboxes of `kind` have a display.
pub fn has_display(kind: Kind) -> bool {
    kind == Kind::Vm
}

/// The running VM of sandbox `id` (a paused one is resumed) and the hold
/// that keeps it thawed; 409 for a kind without a display.
async fn vm_of(d: &Arc<Daemon>, id: &str) -> ApiResult<(Arc<dyn SandboxVm>, crate::freeze::Busy)> {
    let r = ops::row(d, id)?;
    if !has_display(r.kind) {
        return Err(ApiError::Conflict(format!(
            "sandbox '{id}' is a {} sandbox, which has no display (only vm sandboxes do)",
            r.kind
        )));
    }
    let (_, live, busy) = ensure_running(d, id).await?;
    let vm = live
        .vm()
        .ok_or_else(|| ApiError::Internal(format!("sandbox '{id}' has no VM")))?;
    Ok((vm, busy))
}

fn backend_err(context: &'static str, e: BackendError) -> ApiError {
    match e {
        BackendError::Unsupported(..) => ApiError::Conflict(e.to_string()),
        source => ApiError::Backend { context, source },
    }
}

/// A PNG of sandbox `id`'s screen.
pub async fn screen(d: &Arc<Daemon>, id: &str) -> ApiResult<Vec<u8>> {
    let (vm, _busy) = vm_of(d, id).await?;
    tokio::task::spawn_blocking(move || vm.screen())
        .await
        .map_err(|source| ApiError::Task {
            what: "screen".into(),
            source,
        })?
        .map_err(|e| backend_err("screen", e))
}

/// The runtime's event for `e`.
pub fn event(e: Event) -> InputEvent {
    match e {
        Event::Key { key, down } => InputEvent::Key { key, down },
        Event::Move { x, y } => InputEvent::Move { x, y },
        Event::Button { button, down } => InputEvent::Button { button, down },
    }
}

/// Checks `events` (400 for a bad one) and sends them to sandbox `id`'s
/// display, in order.
pub async fn input(d: &Arc<Daemon>, id: &str, events: Vec<Event>) -> ApiResult<()> {
    let events: Vec<InputEvent> = events.into_iter().map(event).collect();
    qemu_input::to_qmp(&events).map_err(|e| ApiError::BadRequest(format!("input: {e}")))?;
    let (vm, _busy) = vm_of(d, id).await?;
    tokio::task::spawn_blocking(move || vm.input(&events))
        .await
        .map_err(|source| ApiError::Task {
            what: "input".into(),
            source,
        })?
        .map_err(|e| backend_err("input", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_events_are_the_runtime_checked_ones() {
        let ok = vec![
            event(Event::Key {
                key: "ret".into(),
                down: true,
            }),
            event(Event::Move { x: 100, y: 32767 }),
            event(Event::Button {
                button: "left".into(),
                down: false,
            }),
        ];
        assert!(qemu_input::to_qmp(&ok).is_ok());
        for bad in [
            Event::Key {
                key: "Ret!".into(),
                down: true,
            },
            Event::Move { x: 40000, y: 0 },
            Event::Button {
                button: "fourth".into(),
                down: true,
            },
        ] {
            assert!(
                qemu_input::to_qmp(&[event(bad.clone())]).is_err(),
                "{bad:?}"
            );
        }
        assert!(qemu_input::to_qmp(&[]).is_err());
        assert!(has_display(Kind::Vm) && !has_display(Kind::MicroVm) && !has_display(Kind::Fake));
    }

    /// A daemon without QEMU refuses a vm template with 400 (never a
    /// crash); bad input is refused before any sandbox is looked at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_daemon_without_the_vm_kind_says_so() {
        use crate::vm_templates::other_kind;
        let tmp = tempfile::tempdir().unwrap();
        let d = crate::template_dirs::tests::daemon(&tmp.path().join("s"), &tmp.path().join("a"));
        assert!(matches!(other_kind(&d, None), Ok(None)));
        assert!(matches!(other_kind(&d, Some("microvm")), Ok(None)));
        match other_kind(&d, Some("vm")) {
            Err(ApiError::BadRequest(m)) => {
                assert!(m.contains("does not run vm sandboxes"), "{m}")
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            other_kind(&d, Some("qemu")),
            Err(ApiError::BadRequest(_))
        ));
        let bad = vec![Event::Move { x: 0, y: 99999 }];
        assert!(matches!(
            input(&d, "nope", bad).await,
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(
            screen(&d, "nope").await,
            Err(ApiError::NotFound(_))
        ));
    }
}
