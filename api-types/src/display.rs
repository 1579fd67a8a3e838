//! A `vm` sandbox's display: `GET /v1/sandboxes/{id}/screen` (a PNG) and
//! `POST /v1/sandboxes/{id}/input`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most events in one input request.
pub const MAX_INPUT_EVENTS: usize = 256;
/// Absolute pointer coordinates run 0..=this across the screen.
pub const POINTER_MAX: u32 = 0x7fff;

/// `POST /v1/sandboxes/{id}/input`: keyboard and pointer events, sent in
/// order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// 1 to 256 events.
    #[schema(min_items = 1, max_items = 256)]
    pub events: Vec<InputEvent>,
}

/// One keyboard or pointer event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum InputEvent {
    /// A key goes down or up; `key` is a QEMU key code name (`a`, `ret`,
    /// `shift`, `f1`, ...: 1-24 lower-case letters, digits or `_`).
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
    /// A pointer button goes down or up: `left`, `middle`, `right`,
    /// `wheel-up` or `wheel-down`.
    Button {
        /// The button.
        button: String,
        /// Pressed (true) or released.
        down: bool,
    },
}
