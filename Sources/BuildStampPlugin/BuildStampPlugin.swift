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
/// The work is `build-stamp.sh` beside this file (its tests run it on such trees); a prebuild command runs it on
/// every build, and it rewrites the file only when the commit changes, so an unchanged tree compiles nothing again.
@main
struct BuildStampPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) async throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "generated")
        return [
            .prebuildCommand(
                displayName: "BuildStamp: git commit of \(context.package.directoryURL.path)",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: [
                    context.package.directoryURL.appending(path: "Sources/BuildStampPlugin/build-stamp.sh").path,
                    output.path, context.package.directoryURL.path,
                ],
                outputFilesDirectory: output)
        ]
    }
}
