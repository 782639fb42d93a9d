// Package tracing turns OpenTelemetry tracing on for a Taskstore process
// (taskstored, taskproxy, taskbench) from the standard OTEL_* environment
// variables, and hands the packages that instrument requests (client, proxy,
// server, cluster) what they need: whether it is on, the W3C propagator, and
// the gRPC stats handlers.
//
// Off by default. Only OTEL_TRACES_EXPORTER naming an exporter other than
// "none", or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), turns it on; OTEL_SDK_DISABLED=true
// turns it off whatever the rest says. Off, no SDK tracer provider is made and
// no stats handler is installed: a request pays nothing for tracing but the
// checks of a boolean. The exporter is the SDK's autoexport (otlp over gRPC or
// HTTP, console), the sampler the SDK's OTEL_TRACES_SAMPLER, the resource
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name defaults to
// the command's name). See docs/tracing.md.
package tracing
