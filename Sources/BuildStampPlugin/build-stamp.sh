#!/bin/sh
# build-stamp.sh OUTPUT-DIRECTORY PACKAGE-DIRECTORY: writes OUTPUT-DIRECTORY/BuildStamp.swift, the commit the
# package directory's sources come from and, when it is staged as the Debian package, the package's version.
# Run by the BuildStamp plugin before every build (BuildStampPlugin.swift says where the commit comes from), and
# by its tests on trees made as scripts/package and `git archive` make them. The file is rewritten only when its
# text changes, so an unchanged tree compiles nothing again.
out="$1"
repo="$2"
mkdir -p "$out"
commit=""
if [ -f "$repo/Sources/BuildStampPlugin/source-commit" ]; then
    # A commit id (12 or more hex digits, shortened to 12), optionally followed by -dirty.
    commit=$(sed -n '1{s/[[:space:]]//g;s/^\([0-9a-f]\{12\}\)[0-9a-f]*\(-dirty\)\{0,1\}$/\1\2/p;q}' \
        "$repo/Sources/BuildStampPlugin/source-commit")
    case "$commit" in ????????????-dirty | ????????????) ;; *) commit="" ;; esac
fi
if [ -z "$commit" ]; then
    top=$(git -c safe.directory="$repo" -C "$repo" rev-parse --show-toplevel 2>/dev/null) || top=""
    if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$(cd "$repo" && pwd -P)" ]; then
        commit=$(git -c safe.directory="$repo" -C "$repo" rev-parse --short=12 HEAD 2>/dev/null) || commit=""
        if [ -n "$commit" ] && [ -n "$(git -c safe.directory="$repo" -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
            commit="$commit-dirty"
        fi
    fi
fi
[ -n "$commit" ] || commit=unknown
package=nil
if [ -f "$repo/debian/changelog" ]; then
    version=$(sed -n '1s/^[a-z0-9.+-]* (\([0-9A-Za-z.+~:-]*\)) .*/\1/p' "$repo/debian/changelog")
    [ -z "$version" ] || package="\"$version\""
fi
text="// Generated before each build by the BuildStamp plugin.
public enum BuildStamp {
    /// The git commit this binary was built from.
    public static let commit = \"$commit\"
    /// The Debian package version when built as the package (from debian/changelog), else nil.
    public static let packageVersion: String? = $package
}"
if [ "$(cat "$out/BuildStamp.swift" 2>/dev/null)" != "$text" ]; then
    printf '%s\n' "$text" >"$out/BuildStamp.swift"
fi
