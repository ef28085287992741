package taskcancel

// ClusterSource is the module's source of cluster-wide gauges, for tests.
var ClusterSource = clusterSource
