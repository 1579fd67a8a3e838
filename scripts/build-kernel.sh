#!/usr/bin/env bash
# Build the Shoal guest kernel (Linux 6.1 from Debian's linux-source-6.1,
# tinyconfig + kernel-configs/shoal.config + kernel-configs/patches/*.patch).
#
# Usage: scripts/build-kernel.sh
#   The LAST line of stdout is the absolute path of the uncompressed vmlinux;
#   everything else goes to stderr.
#   SHOAL_KERNEL=/path/vmlinux  -> print that path and do nothing else.
#   SHOAL_CACHE (default ~/.cache/shoal): cache root. Results live in
#   $SHOAL_CACHE/kernel/<sha256>/{vmlinux,config,System.map}, keyed by the
#   config fragment, the patches, the linux-source-6.1 package version and
#   this script. A cached build is returned at once.
set -euo pipefail

if [[ -n "${SHOAL_KERNEL:-}" ]]; then
    printf '%s\n' "$SHOAL_KERNEL"
    exit 0
fi

exec 3>&1 1>&2 # stdout is reserved for the final path (fd 3)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="$here/$(basename "${BASH_SOURCE[0]}")"
cfgdir="$(cd "$here/../kernel-configs" && pwd)"
fragment="$cfgdir/shoal.config"
tarball=/usr/src/linux-source-6.1.tar.xz
shopt -s nullglob
patches=("$cfgdir"/patches/*.patch)
shopt -u nullglob

die() { echo "build-kernel: error: $*" >&2; exit 1; }
log() { echo "build-kernel: $*" >&2; }

srcver() { dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null || true; }

# --- Dependencies: install what is missing (non-interactive), then go on.
ensure_deps() {
    local need=() tool pkg
    [[ -n "$(srcver)" && -f "$tarball" ]] || need+=(linux-source-6.1)
    for tool in make:make gcc:gcc flex:flex bison:bison bc:bc xz:xz-utils \
                patch:patch objcopy:binutils perl:perl flock:util-linux; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
    done
    for pkg in libelf-dev libssl-dev; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" \
            || need+=("$pkg")
    done
    if ((${#need[@]})); then
        log "installing missing packages: ${need[*]}"
        local sudo=()
        [[ $(id -u) -eq 0 ]] || sudo=(sudo)
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || true
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${need[@]}" >&2 \
            || die "apt-get install ${need[*]} failed"
    fi
}

[[ -f "$fragment" ]] || die "missing $fragment"
[[ -n "$(srcver)" ]] || ensure_deps

version="$(srcver)"
[[ -n "$version" ]] || die "linux-source-6.1 is not installed"

# --- Cache key: fragment + patches (names and contents) + source version + this script.
key="$({
    echo "fragment"; cat "$fragment"
    for p in "${patches[@]}"; do echo "patch $(basename "$p")"; cat "$p"; done
    echo "linux-source-6.1 $version"
    echo "script"; cat "$script"
} | sha256sum | cut -d' ' -f1)"

cache="${SHOAL_CACHE:-$HOME/.cache/shoal}/kernel"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
dest="$cache/$key"

if [[ -f "$dest/vmlinux" ]]; then
    echo "$dest/vmlinux" >&3
    exit 0
fi

ensure_deps

# One build per key at a time; a second caller waits and then finds the result.
exec 9>"$cache/.$key.lock"
flock 9
if [[ -f "$dest/vmlinux" ]]; then
    echo "$dest/vmlinux" >&3
    exit 0
fi

work="$(mktemp -d "$cache/.build-$key.XXXXXX")"
trap 'rm -rf "$work"' EXIT
buildlog="$work/build.log"

log "building kernel $key (linux-source-6.1 $version, ${#patches[@]} patches) in $work"
log "extracting $tarball"
tar -xf "$tarball" -C "$work"
src="$work/linux-source-6.1"
[[ -d "$src" ]] || die "tarball did not contain linux-source-6.1/"

log "applying ${#patches[@]} patches (kernel-configs/patches)"
for p in "${patches[@]}"; do
    patch -d "$src" -p1 --batch --forward --quiet < "$p" || die "patch $(basename "$p") failed"
done

log "configuring (tinyconfig + shoal.config)"
(
    cd "$src"
    make tinyconfig
    scripts/kconfig/merge_config.sh -m .config "$fragment"
    make olddefconfig
) >"$buildlog" 2>&1 || { tail -n 40 "$buildlog" >&2; die "configuration failed"; }

# merge_config.sh silently drops options whose dependencies are unmet:
# every "CONFIG_X=val" line of the fragment must be in the final .config
# and every "# CONFIG_X is not set" line must not be =y/=m.
missing=()
while IFS= read -r line; do
    case "$line" in
        CONFIG_*=*)
            grep -qxF -- "$line" "$src/.config" || missing+=("$line (got: $(
                grep -E "^${line%%=*}=|^# ${line%%=*} is not set" "$src/.config" || echo absent))")
            ;;
        "# CONFIG_"*" is not set")
            opt="${line#\# }"; opt="${opt%% *}"
            if grep -qE "^$opt=[ym]" "$src/.config"; then
                missing+=("$opt must be off (got: $(grep -E "^$opt=" "$src/.config"))")
            fi
            ;;
    esac
done < "$fragment"
if ((${#missing[@]})); then
    echo "build-kernel: the final .config does not match shoal.config:" >&2
    printf '  %s\n' "${missing[@]}" >&2
    die "fix kernel-configs/shoal.config (unmet dependencies?)"
fi
log "config verified: every option of shoal.config is as requested"

# Objects a build compiles (kbuild's "  CC"/"  AS" lines): the count of
# this machine's last build, else the count measured for shoal.config.
expected="$(cat "$cache/.objects" 2>/dev/null || true)"
[[ "$expected" =~ ^[0-9]+$ ]] || expected="$(cat "$cfgdir/objects" 2>/dev/null || true)"
[[ "$expected" =~ ^[0-9]+$ ]] || expected=0

# "3m05s"
hms() { if (($1 >= 60)); then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi; }

jobs="$(nproc)"
log "make -j$jobs vmlinux (log: $buildlog; takes minutes)"
start=$SECONDS
make -C "$src" -j"$jobs" vmlinux >>"$buildlog" 2>&1 &
make_pid=$!
# Progress every 5 s while make runs: objects compiled (of those expected),
# elapsed, an estimate of what is left and the step make is at.
last=""
while kill -0 "$make_pid" 2>/dev/null; do
    sleep 5 & wait $! || true
    kill -0 "$make_pid" 2>/dev/null || break
    done_n="$(grep -cE '^  (CC|AS) ' "$buildlog" || true)"
    step="$(grep -E '^  [A-Z]+ ' "$buildlog" | tail -n 1 | sed -E 's/^ +//; s/ +/ /g' || true)"
    el=$((SECONDS - start))
    if ((expected > 0 && done_n > 0)); then
        shown=$((done_n < expected ? done_n : expected))
        pct=$((100 * shown / expected))
        left=$(((el * (expected - shown)) / done_n))
        msg="$shown/$expected objects ($pct%), $(hms "$el") elapsed, ~$(hms "$left") left"
    else
        msg="$done_n objects, $(hms "$el") elapsed"
    fi
    [[ -n "$step" ]] && msg="$msg ($step)"
    [[ "$msg" != "$last" ]] && log "progress $msg"
    last="$msg"
done
if ! wait "$make_pid"; then
    cp "$buildlog" "$cache/$key.failed.log" || true
    tail -n 60 "$buildlog" >&2
    die "kernel build failed (full log: $cache/$key.failed.log)"
fi
grep -cE '^  (CC|AS) ' "$buildlog" >"$cache/.objects" 2>/dev/null || true
log "built in $(hms $((SECONDS - start))) ($(cat "$cache/.objects" 2>/dev/null || echo '?') objects)"

# Install: vmlinux last, by rename on the same filesystem, so a present
# $dest/vmlinux always means a complete build.
mkdir -p "$dest"
objcopy --strip-debug "$src/vmlinux" "$dest/.vmlinux.tmp"
cp "$src/.config" "$dest/.config.tmp" && mv -f "$dest/.config.tmp" "$dest/config"
cp "$src/System.map" "$dest/.System.map.tmp" && mv -f "$dest/.System.map.tmp" "$dest/System.map"
mv -f "$dest/.vmlinux.tmp" "$dest/vmlinux"
log "installed $dest/vmlinux"
echo "$dest/vmlinux" >&3
