//! Who may make, use and change which templates. The names
//! `{"image": ...}` creates use (`IMAGE-Nc-Mm[-HASH]`,
//! [`crate::templates::image_template_name`], and `oci-ID-Nc-Mm[-HASH]` for
//! an OCI image of the image store, [`crate::containers`]) are the daemon's: no caller
//! can snapshot into one, register one with other content than the daemon
//! would give it, or delete one (admins can); every other template is its
//! maker's ([`Principal::may_change`]).

use crate::auth::Principal;
use crate::db::TemplateRow;
use crate::{ApiError, ApiResult};
use shoal_images::artifacts::IMAGES;

/// The first word of a container template's name (`oci-ID-Nc-Mm`,
/// [`crate::containers`]).
pub const OCI_PREFIX: &str = "oci";

/// The owner recorded for the daemon's templates.
pub const DAEMON: &str = "daemon";

/// The image of a derived name (`IMAGE-Nc-Mm` with an optional 12-hex
/// hash; `oci` for `oci-ID-Nc-Mm[-HASH]`, ID 12 hex digits of an OCI
/// image's id), or None for any other name.
pub fn derived_image(name: &str) -> Option<&'static str> {
    let images = IMAGES.iter().copied().chain([OCI_PREFIX]);
    images.into_iter().find(|img| {
        let Some(mut rest) = name.strip_prefix(img).and_then(|r| r.strip_prefix('-')) else {
            return false;
        };
        if *img == OCI_PREFIX {
            match rest.split_once('-') {
                Some((id, r)) if is_hex12(id) => rest = r,
                _ => return false,
            }
        }
        let mut parts = rest.split('-');
        let digits = |s: &str, suffix: char| {
            s.strip_suffix(suffix)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        let shape = matches!(
            (parts.next(), parts.next()),
            (Some(c), Some(m)) if digits(c, 'c') && digits(m, 'm')
        );
        // Then the root's hash, and `net` for a networked template, each
        // optional, in this order.
        let rest: Vec<&str> = parts.collect();
        let rest = match rest.split_last() {
            Some((&NET_SUFFIX, r)) => r,
            _ => &rest[..],
        };
        shape && matches!(rest, [] | [_]) && rest.iter().all(|h| is_hex12(h))
    })
}

/// The last part of a networked derived template's name.
pub const NET_SUFFIX: &str = "net";

/// The derived name `name` of a networked template when `net`.
pub fn with_net(name: String, net: bool) -> String {
    if net {
        format!("{name}-{NET_SUFFIX}")
    } else {
        name
    }
}

fn is_hex12(h: &str) -> bool {
    h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The owner to record for a template `who` registers as `name`, which
/// the daemon would name `derived` (its image, shape and root): the
/// daemon's when `name` is exactly that (the daemon would make the same),
/// 403 for another derived name, `who`'s otherwise.
pub fn owner_for_create(who: &Principal, name: &str, derived: &str) -> ApiResult<String> {
    if *who == Principal::Daemon || name == derived {
        return Ok(DAEMON.into());
    }
    if derived_image(name).is_some() {
        return Err(reserved(name));
    }
    Ok(who.id())
}

/// 403 for a snapshot into a derived name.
pub fn check_snapshot_name(name: &str) -> ApiResult<()> {
    match derived_image(name) {
        Some(_) => Err(reserved(name)),
        None => Ok(()),
    }
}

fn reserved(name: &str) -> ApiError {
    ApiError::Forbidden(format!(
        "template name '{name}' is reserved: IMAGE-Nc-Mm (and oci-ID-Nc-Mm) names are the \
         templates the daemon makes for {{\"image\": ...}} creates; choose another name"
    ))
}

/// 403 unless `who` may delete `t` (or change its pool: `pool`, where the
/// daemon's templates are everyone's).
pub fn check_owner(who: &Principal, t: &TemplateRow, pool: bool) -> ApiResult<()> {
    let owner = t.owner.as_deref();
    if who.may_change(owner) || (pool && owner == Some(DAEMON)) {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "template '{}' belongs to {}; only its owner or an admin may change it",
        t.name,
        owner.unwrap_or("no one recorded (made by an older daemon)")
    )))
}

/// Whether `t`, found under a derived name, is the daemon's own (one made
/// otherwise, by a squatter before owners were recorded, is not used).
pub fn is_daemons(t: &TemplateRow) -> bool {
    t.owner.as_deref() == Some(DAEMON)
}

#[cfg(test)]
#[path = "template_names_tests.rs"]
mod tests;
