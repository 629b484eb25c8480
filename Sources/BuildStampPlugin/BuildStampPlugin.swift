import Foundation
import PackagePlugin

/// Writes `BuildStamp.commit` (the git commit this binary is built from) and `BuildStamp.packageVersion` (the
/// Debian package version, from `debian/changelog`, when the tree is built as the package: scripts/package stages
/// the packaging there) into the target before every build:
/// SwiftPM has no other build-time hook, and a committed constant would always name the commit before the one
/// that contains it.
///
/// Where the commit comes from, first match wins:
/// 1. `Sources/BuildStampPlugin/source-commit`, when it holds a commit: scripts/package writes the commit of the
///    tree it stages (`-dirty` with uncommitted changes) into its copy, and `git archive` writes it into an
///    archive (the repository's copy holds a `$Format:%H$` placeholder, see `.gitattributes` here). A build from
///    either has no `.git` and still knows its commit.
/// 2. git, when the package directory is the top of a git work tree (`-dirty` with uncommitted changes). A tree
///    inside another repository's work tree (a staged copy under `.local/`) does not take that repository's commit.
/// 3. `unknown`.
///
/// A prebuild command runs on every build; the file is rewritten only when the commit changes, so an unchanged
/// tree compiles nothing again.
@main
struct BuildStampPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) async throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "generated")
        let script = #"""
            out="$1"; repo="$2"
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
                printf '%s\n' "$text" > "$out/BuildStamp.swift"
            fi
            """#
        return [
            .prebuildCommand(
                displayName: "BuildStamp: git commit of \(context.package.directoryURL.path)",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: ["-c", script, "sh", output.path, context.package.directoryURL.path],
                outputFilesDirectory: output)
        ]
    }
}
