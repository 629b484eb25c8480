import Foundation
import MetricsdTestSupport
import Testing

/// Where `metricsd --version` gets its commit: `Sources/BuildStampPlugin/build-stamp.sh` (what the BuildStamp
/// plugin runs before every build) on trees made as they reach a build: a git checkout, `git archive`'s tarball
/// (no `.git`), scripts/package's staged copy (no `.git`, the commit written in), and a plain copy (no commit at
/// all). Each tree is made from a throwaway git repository holding the plugin's files as the source tree has them.
@Suite struct BuildStampTests {
    static let pluginDirectory = CommandLineTests.root.appendingPathComponent("Sources/BuildStampPlugin").path

    /// Runs a shell script (`$1`… are `arguments`) and returns its stdout; fails on a non-zero exit.
    static func sh(_ script: String, _ arguments: String...) async throws -> String {
        let result = try await Subprocess.capture(
            "/bin/sh", ["-c", "set -e\n" + script, "sh"] + arguments,
            environment: [
                "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin", "HOME": NSTemporaryDirectory(),
                "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t",
            ])
        #expect(result.status == 0, "\(script)\n\(result.stderr)")
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The stamp build-stamp.sh writes for the tree at `tree`: (commit, package version or "nil").
    static func stamp(of tree: String) async throws -> (commit: String, package: String) {
        let out = try scratchFile("unused", "") + "-stamp"
        let text = try await Self.sh(
            #"sh "$1/build-stamp.sh" "$2" "$3" && cat "$2/BuildStamp.swift""#, Self.pluginDirectory, out, tree)
        let commit = text.firstMatch(of: /let commit = "([^"]*)"/).map { String($0.output.1) } ?? "(none)"
        let package = text.firstMatch(of: /let packageVersion: String\? = (.*)/).map { String($0.output.1) } ?? "(none)"
        return (commit, package)
    }

    /// A new git repository with the plugin directory as the source tree has it (source-commit's placeholder and
    /// the .gitattributes that fills it in), one commit; returns its path and its full commit id.
    static func repository() async throws -> (path: String, commit: String) {
        let path = try scratchFile("unused", "") + "-repo"
        let commit = try await Self.sh(
            #"""
            mkdir -p "$2/Sources/BuildStampPlugin"
            cp "$1/source-commit" "$1/.gitattributes" "$1/build-stamp.sh" "$2/Sources/BuildStampPlugin/"
            cd "$2"
            git init -q .
            git add -A
            git commit -q -m one
            git rev-parse HEAD
            """#, Self.pluginDirectory, path)
        return (path, commit)
    }

    @Test func theSourceTreeHoldsThePlaceholderThatGitArchiveFillsIn() throws {
        let text = try String(contentsOfFile: Self.pluginDirectory + "/source-commit", encoding: .utf8)
        #expect(text == "$Format:%H$\n")
        let attributes = try String(contentsOfFile: Self.pluginDirectory + "/.gitattributes", encoding: .utf8)
        #expect(attributes.split(separator: "\n").contains("source-commit export-subst"), "\(attributes)")
    }

    @Test func aGitArchiveTarballWithoutGitNamesItsCommit() async throws {
        let (repo, commit) = try await Self.repository()
        let tree = repo + "-archive"
        _ = try await Self.sh(
            #"mkdir "$2" && git -C "$1" archive HEAD | tar -x -C "$2" && test ! -e "$2/.git""#, repo, tree)
        let stamp = try await Self.stamp(of: tree)
        #expect(stamp.commit == String(commit.prefix(12)), "\(stamp) for \(commit)")
        #expect(stamp.package == "nil")
    }

    @Test func aStagedPackageTreeNamesItsCommitAndPackageVersion() async throws {
        let (repo, _) = try await Self.repository()
        let tree = repo + "-staged"
        // As scripts/package stages it: the files, the commit written into source-commit, debian/changelog.
        _ = try await Self.sh(
            #"""
            mkdir -p "$2/debian"
            git -C "$1" ls-files -z | (cd "$1" && tar --null -T - -cf -) | tar -x -C "$2"
            printf '0123456789ab-dirty\n' > "$2/Sources/BuildStampPlugin/source-commit"
            printf 'metricsd (1.0.0+upgradetest1) bookworm; urgency=medium\n\n  * x\n' > "$2/debian/changelog"
            """#, repo, tree)
        let stamp = try await Self.stamp(of: tree)
        #expect(stamp.commit == "0123456789ab-dirty")
        #expect(stamp.package == "\"1.0.0+upgradetest1\"")
    }

    @Test func aCheckoutNamesItsHeadAndSaysDirty() async throws {
        let (repo, commit) = try await Self.repository()
        #expect(try await Self.stamp(of: repo).commit == String(commit.prefix(12)))
        _ = try await Self.sh(#"echo '# changed' >> "$1/Sources/BuildStampPlugin/build-stamp.sh""#, repo)
        #expect(try await Self.stamp(of: repo).commit == String(commit.prefix(12)) + "-dirty")
    }

    @Test func aTreeWithoutAnyCommitSaysUnknown() async throws {
        let (repo, _) = try await Self.repository()
        // A plain copy of the files (the placeholder not filled in), outside any work tree.
        let copy = repo + "-copy"
        _ = try await Self.sh(#"mkdir "$2" && cp -R "$1/Sources" "$2/""#, repo, copy)
        #expect(try await Self.stamp(of: copy).commit == "unknown")
        // The same copy inside another repository's work tree does not take that repository's commit.
        let nested = repo + "/staged"
        _ = try await Self.sh(#"mkdir "$2" && cp -R "$1/Sources" "$2/""#, repo, nested)
        #expect(try await Self.stamp(of: nested).commit == "unknown")
        // A source-commit that is not a commit id is not believed.
        _ = try await Self.sh(#"printf 'main\n' > "$1/Sources/BuildStampPlugin/source-commit""#, copy)
        #expect(try await Self.stamp(of: copy).commit == "unknown")
    }
}
