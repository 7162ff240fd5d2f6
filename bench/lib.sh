# Shared by the host benches (bash; source it): removing what a bench made in the cgroup tree,
# also when dbcage's own `release` did not run or failed (a killed run, an old build).

CG=${CG:-/sys/fs/cgroup}

# remove_tree DIR: empties DIR's groups into DIR's parent (never in the memory hierarchy, where
# the machine's supervisor keeps its group: tasks stay there and the removal waits for them to
# leave) and removes them, deepest first. Refuses a directory not named dbcage-test*.
remove_tree() {
    local top=$1 parent d pid
    [ -d "$top" ] || return 0
    case "$(basename "$top")" in *dbcage-test*) ;; *) echo "bench: refusing to remove $top" >&2; return 0 ;; esac
    parent=$(dirname "$top")
    for _ in $(seq 50); do
        while read -r d; do
            case "$top" in
                "$CG/memory/"*) ;;
                *) while read -r pid; do
                       echo "$pid" >"$parent/cgroup.procs" 2>/dev/null || true
                   done <"$d/cgroup.procs" ;;
            esac
            rmdir "$d" 2>/dev/null || true
        done < <(find "$top" -depth -type d)
        [ -d "$top" ] || return 0
        sleep 0.1
    done
    echo "bench: could not remove $top" >&2
}

# remove_root NAME: every group named NAME in any hierarchy (dbcage's root under `parent =
# "self"` sits below this shell's own groups, which differ per hierarchy).
remove_root() {
    local d
    while read -r d; do remove_tree "$d"; done < <(find "$CG" -maxdepth 6 -type d -name "$1" 2>/dev/null)
}
