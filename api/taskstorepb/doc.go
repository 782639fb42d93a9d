// Package taskstorepb is Taskstore's API contract: the messages
// and services of api/proto/taskstore/v1/taskstore.proto and the code
// generated from them (gRPC, and the HTTP/JSON gateway and its OpenAPI
// description from taskstore_http.yaml; `make proto`), with the rules every side must apply
// alike: the consistency group and hash slot of a queue (GroupOf, SlotOf),
// message limits, request decoding, health service names.
//
// It is a leaf: it imports nothing of this module, so the client, the
// proxy, the node's server and the cluster layer all speak it without
// importing each other.
package taskstorepb

//go:generate make -C ../.. proto-api
