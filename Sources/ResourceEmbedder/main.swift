// Writes files into a Swift source as string literals, so that the installed binary carries them: the
// migrations (`migrations/*.sql`) and the OpenAPI document. Run by the EmbedResources build-tool plugin before
// the targets that use them compile; the files themselves stay the one source.
//
// usage: ResourceEmbedder migrations OUTPUT.swift FILE.sql...
//        ResourceEmbedder openapi OUTPUT.swift FILE.yaml

import Foundation

/// `text` as a raw multi-line string literal, with enough `#` that nothing inside can end it.
func literal(_ text: String) -> String {
    var hashes = "#"
    while text.contains("\"\"\"" + hashes) || text.contains("\"" + hashes) { hashes += "#" }
    return hashes + "\"\"\"\n" + text + "\"\"\"" + hashes
}

func contents(_ path: String) throws -> String {
    var text = try String(contentsOfFile: path, encoding: .utf8)
    if !text.hasSuffix("\n") { text += "\n" }
    return text
}

/// Writes `source` to `path` unless it already says exactly that (an unchanged input recompiles nothing).
func write(_ source: String, to path: String) throws {
    if let existing = try? String(contentsOfFile: path, encoding: .utf8), existing == source { return }
    try source.write(toFile: path, atomically: true, encoding: .utf8)
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 3 else {
    FileHandle.standardError.write(Data("usage: ResourceEmbedder migrations|openapi OUTPUT.swift FILE...\n".utf8))
    exit(64)
}
let (mode, output, inputs) = (arguments[0], arguments[1], Array(arguments.dropFirst(2)))
do {
    var source = "// Generated at build time by the EmbedResources plugin. Do not edit; edit the files named below.\n\n"
    switch mode {
    case "migrations":
        let files = inputs.sorted { ($0 as NSString).lastPathComponent < ($1 as NSString).lastPathComponent }
        source +=
            "extension Migration {\n    /// Every migration of this build, in order.\n    public static let all: [Migration] = [\n"
        for file in files {
            let name = (file as NSString).lastPathComponent
            source += "        Migration(name: \"\(name)\", sql: \(literal(try contents(file)))),\n"
        }
        source += "    ]\n}\n"
    case "openapi":
        source += "/// The API contract served at `GET /openapi.yaml` (`Resources/openapi.yaml`).\n"
        source += "enum OpenAPIDocument {\n    static let yaml = \(literal(try contents(inputs[0])))\n}\n"
    default:
        FileHandle.standardError.write(Data("ResourceEmbedder: unknown mode \(mode)\n".utf8))
        exit(64)
    }
    try write(source, to: output)
} catch {
    FileHandle.standardError.write(Data("ResourceEmbedder: \(error)\n".utf8))
    exit(1)
}
