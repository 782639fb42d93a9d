{{/* The base name of every object: RELEASE-taskstore, or RELEASE when it already says taskstore. */}}
{{- define "taskstore.fullname" -}}
{{- if contains "taskstore" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-taskstore" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "taskstore.labels" -}}
app.kubernetes.io/name: taskstore
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "taskstore.nodeSelectorLabels" -}}
app.kubernetes.io/name: taskstore
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "taskstore.proxySelectorLabels" -}}
app.kubernetes.io/name: taskstore
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end -}}

{{- define "taskstore.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The nodes' gRPC addresses by their stable DNS names: id=host:port,... or host:port,... */}}
{{- define "taskstore.initialCluster" -}}
{{- $f := include "taskstore.fullname" . -}}
{{- $out := list -}}
{{- range $i := until (int .Values.node.replicas) -}}
{{- $out = append $out (printf "%s-%d=%s-%d.%s-peers:7101" $f $i $f $i $f) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{- define "taskstore.nodeAddresses" -}}
{{- $f := include "taskstore.fullname" . -}}
{{- $out := list -}}
{{- range $i := until (int .Values.node.replicas) -}}
{{- $out = append $out (printf "%s-%d.%s-peers:7101" $f $i $f) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{- define "taskstore.httpScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}

{{/* Checks of combinations the binaries refuse, so that they fail at install and not in a crash loop. */}}
{{- define "taskstore.validate" -}}
{{- if and .Values.auth.tokensSecret (not .Values.tls.enabled) -}}
{{- fail "auth.tokensSecret needs tls.enabled: tokens are refused over plaintext" -}}
{{- end -}}
{{- if and .Values.tls.enabled (or (not .Values.tls.nodeSecret) (not .Values.tls.proxySecret)) -}}
{{- fail "tls.enabled needs tls.nodeSecret and tls.proxySecret" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.auth.tokensSecret) (not .Values.proxy.allowAnonymous) -}}
{{- fail "tls.enabled without auth.tokensSecret: set proxy.allowAnonymous=true to serve callers without a credential" -}}
{{- end -}}
{{- if lt (int .Values.node.replicas) 1 -}}
{{- fail "node.replicas must be at least 1" -}}
{{- end -}}
{{- end -}}
