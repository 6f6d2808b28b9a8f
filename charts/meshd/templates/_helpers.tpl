{{/* The operator's objects' name. */}}
{{- define "meshd.operator" -}}
{{ .Release.Name }}-operator
{{- end }}

{{/* Labels every object of the chart carries. */}}
{{- define "meshd.labels" -}}
app.kubernetes.io/name: meshd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: meshd
{{- end }}
