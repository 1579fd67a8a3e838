//! Keyboard and pointer events for a VM's display, checked before they
//! become QMP `input-send-event` events.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Most events in one request.
pub const MAX_EVENTS: usize = 256;
/// Absolute pointer coordinates run 0..=this (QEMU's absolute axis scale).
pub const ABS_MAX: u32 = 0x7fff;

/// One input event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum InputEvent {
    /// A key goes down or up; `key` is a QEMU key code name (`a`, `ret`,
    /// `shift`, `f1`, ...).
    Key {
        /// The key.
        key: String,
        /// Pressed (true) or released.
        down: bool,
    },
    /// The pointer moves to (x, y), each 0..=32767 across the screen.
    Move {
        /// Horizontal position.
        x: u32,
        /// Vertical position.
        y: u32,
    },
    /// A pointer button goes down or up.
    Button {
        /// `left`, `middle`, `right`, `wheel-up` or `wheel-down`.
        button: String,
        /// Pressed (true) or released.
        down: bool,
    },
}

const BUTTONS: [&str; 5] = ["left", "middle", "right", "wheel-up", "wheel-down"];

/// Checks `events` and turns them into QMP `InputEvent`s.
pub fn to_qmp(events: &[InputEvent]) -> Result<Vec<Value>, String> {
    if events.is_empty() || events.len() > MAX_EVENTS {
        return Err(format!("1 to {MAX_EVENTS} events, not {}", events.len()));
    }
    let mut out = Vec::with_capacity(events.len() * 2);
    for e in events {
        match e {
            InputEvent::Key { key, down } => {
                let ok = (1..=24).contains(&key.len())
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !ok {
                    return Err(format!("key {key:?} is not a QEMU key code name"));
                }
                out.push(json!({"type": "key", "data": {
                    "down": down, "key": {"type": "qcode", "data": key}}}));
            }
            InputEvent::Move { x, y } => {
                if *x > ABS_MAX || *y > ABS_MAX {
                    return Err(format!("pointer ({x}, {y}) outside 0..={ABS_MAX}"));
                }
                out.push(json!({"type": "abs", "data": {"axis": "x", "value": x}}));
                out.push(json!({"type": "abs", "data": {"axis": "y", "value": y}}));
            }
            InputEvent::Button { button, down } => {
                if !BUTTONS.contains(&button.as_str()) {
                    return Err(format!("button {button:?}: one of {BUTTONS:?}"));
                }
                out.push(json!({"type": "btn", "data": {"down": down, "button": button}}));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_checked_and_translated() {
        let evs: Vec<InputEvent> = serde_json::from_str(
            r#"[{"type":"key","key":"a","down":true},{"type":"move","x":10,"y":20},
                {"type":"button","button":"left","down":false}]"#,
        )
        .unwrap();
        let q = to_qmp(&evs).unwrap();
        assert_eq!(q.len(), 4);
        assert_eq!(q[0]["data"]["key"]["data"], "a");
        assert_eq!(q[2]["data"]["value"], 20);
        let bad = |e: InputEvent| to_qmp(&[e]).unwrap_err();
        assert!(bad(InputEvent::Key {
            key: "A;quit".into(),
            down: true
        })
        .contains("key code"));
        assert!(bad(InputEvent::Move { x: 40000, y: 0 }).contains("outside"));
        assert!(bad(InputEvent::Button {
            button: "side".into(),
            down: true
        })
        .contains("one of"));
        assert!(to_qmp(&[]).is_err());
        assert!(
            serde_json::from_str::<InputEvent>(r#"{"type":"key","key":"a","down":1}"#).is_err()
        );
    }
}
