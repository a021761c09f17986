// Package specs builds the objects the RenderQueue operator creates for a RenderQueue, as pure
// functions of the RenderQueue (and the operator's image): no client, no I/O. The reconciler in
// package controllers creates and updates what they return.
//
//   - names.go: the deterministic names of the children (TokenSecretName, ServiceName,
//     ShardServiceAccountName, PDBName), the shards spec.shards asks for (TargetShards) and their
//     order (SortShards), the labels of the children and the shard Pods' selector;
//   - podtemplate.go: the shard Pod (ShardPod) and the hash of its template (PodTemplateHash),
//     whose change replaces the shards one at a time;
//   - children.go: the shard ServiceAccount/Role/RoleBinding, headless Service and
//     PodDisruptionBudget as create-or-update mutations (Children), and the API token Secret
//     (TokenSecret);
//   - tls.go and podtemplate_tls.go (spec.tls OperatorIssued): the shard CA ConfigMap
//     (ShardCAConfigMap) and what the shard Pods need to serve HTTPS — the certificate Secret
//     mounted, the keeper's --tls-cert-file/--tls-key-file, probes over HTTPS, the
//     renderqueue.dev/tls label.
package specs
