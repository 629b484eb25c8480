import Foundation
import PackagePlugin

/// Embeds the files a target serves or applies into its sources at build time, so the one source of each stays
/// the file itself and nothing generated is committed: `migrations/*.sql` into `MetricsdPostgres`
/// (`Migration.all`), `Resources/openapi.yaml` into `MetricsdDaemon` (`OpenAPIDocument.yaml`).
///
/// A build command with declared inputs and output: SwiftPM runs it again only when an input changed.
@main
struct EmbedResourcesPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) async throws -> [Command] {
        let tool = try context.tool(named: "ResourceEmbedder").url
        let work = context.pluginWorkDirectoryURL
        switch target.name {
        case "MetricsdPostgres":
            let directory = context.package.directoryURL.appending(path: "migrations")
            let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
                .filter { $0.hasSuffix(".sql") }.sorted()
            let inputs = names.map { directory.appending(path: $0) }
            let output = work.appending(path: "Migrations+Embedded.swift")
            return [
                .buildCommand(
                    displayName: "Embedding \(inputs.count) migrations into \(target.name)", executable: tool,
                    arguments: ["migrations", output.path] + inputs.map(\.path), inputFiles: inputs,
                    outputFiles: [output])
            ]
        case "MetricsdDaemon":
            guard let target = target as? SourceModuleTarget else { return [] }
            let input = target.directoryURL.appending(path: "Resources/openapi.yaml")
            let output = work.appending(path: "OpenAPIDocument+Embedded.swift")
            return [
                .buildCommand(
                    displayName: "Embedding the OpenAPI document into \(target.name)", executable: tool,
                    arguments: ["openapi", output.path, input.path], inputFiles: [input], outputFiles: [output])
            ]
        default:
            Diagnostics.error("EmbedResources does not know what to embed into \(target.name)")
            return []
        }
    }
}
