import Foundation
import PackagePlugin

/// Writes `BuildStamp.commit` (the git commit of the source tree, `-dirty` with uncommitted changes, `unknown`
/// outside a git checkout) into the target before every build: SwiftPM has no other build-time hook, and a
/// committed constant would always name the commit before the one that contains it.
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
            commit=$(git -c safe.directory="$repo" -C "$repo" rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
            if [ "$commit" != unknown ] && [ -n "$(git -c safe.directory="$repo" -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
                commit="$commit-dirty"
            fi
            text="// Generated before each build by the BuildStamp plugin.
            public enum BuildStamp {
                /// The git commit this binary was built from.
                public static let commit = \"$commit\"
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
