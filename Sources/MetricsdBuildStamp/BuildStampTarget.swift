// `BuildStamp.commit` is generated into this target before each build by the BuildStamp plugin
// (Sources/BuildStampPlugin), from the git commit of the source tree.
