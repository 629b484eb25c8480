import MetricsdCLI

// Everything happens in MetricsdCLI (commands, configuration) and the modules below it.
await MetricsdCommand.main()
