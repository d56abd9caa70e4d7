{{/* The release's name prefix: <release>, or <release>-clusterwarden when the release name
does not say it (cluster-wide objects carry it, so two releases never collide). */}}
{{- define "clusterwarden.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "clusterwarden.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "<name>"). */}}
{{- define "clusterwarden.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "clusterwarden.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "clusterwarden.backendServiceAccount" -}}
{{- .Values.backendServiceAccount.name | default (printf "%s-backend" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.agentServiceAccount" -}}
{{- .Values.agentServiceAccount.name | default (printf "%s-agent" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.inventoryServiceAccount" -}}
{{- .Values.inventoryServiceAccount.name | default (printf "%s-inventory" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.connectionsSecret" -}}
{{- .Values.connectionsSecret | default (printf "%s-connections" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.keysSecret" -}}
{{- .Values.keysSecret | default (printf "%s-keys" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.tokensSecret" -}}
{{- .Values.tokensSecret | default (printf "%s-api-tokens" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.agentSecret" -}}
{{- .Values.agentSecret | default (printf "%s-agent" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{- define "clusterwarden.kafkaSecret" -}}
{{- .Values.kafka.credentialsSecret | default (printf "%s-kafka" (include "clusterwarden.fullname" .)) -}}
{{- end -}}

{{/* The Kafka security protocol, checked: one of the three the chart wires. */}}
{{- define "clusterwarden.kafkaProtocol" -}}
{{- $protocol := .Values.kafka.securityProtocol | default "PLAINTEXT" -}}
{{- if not (has $protocol (list "PLAINTEXT" "SASL_SSL" "SSL")) -}}
{{- fail (printf "kafka.securityProtocol: PLAINTEXT, SASL_SSL or SSL, not %q" $protocol) -}}
{{- end -}}
{{- $protocol -}}
{{- end -}}

{{/* The API's entry of the nodes' bootstrap token: its digest (as `warden api token --role
node` prints it, and under the user `warden secrets init` gives it), so the API's Secret holds
no token one could enrol with. */}}
{{- define "clusterwarden.bootstrapEntry" -}}
sha256={{ .Values.reportAuth.bootstrapToken | trim | sha256sum }}:node-bootstrap:node
{{- end -}}

{{/* Whether the agents enrol themselves (a bootstrap token in the agents' Secret): given one
in the values, or a Secret of one's own, which must hold it. */}}
{{- define "clusterwarden.agentsEnrol" -}}
{{- if or .Values.agentSecret .Values.reportAuth.bootstrapToken -}}true{{- end -}}
{{- end -}}

{{/* One principal's Kafka connection (schemas/access.py): its SASL username and its own
password, or its own client certificate, and the broker's CA. Nothing with PLAINTEXT. Call
with (dict "root" $ "principal" "<name>" "secret" "<Secret holding its credentials>"); the
files are the `kafka` volume's (clusterwarden.kafkaVolume). */}}
{{- define "clusterwarden.kafkaEnv" -}}
{{- $protocol := include "clusterwarden.kafkaProtocol" .root -}}
{{- if eq $protocol "SASL_SSL" }}
- name: KAFKA_SASL_USERNAME
  value: {{ .principal }}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .principal }}-password
{{- end }}
{{- if ne $protocol "PLAINTEXT" }}
{{- if .root.Values.kafka.caCert }}
- name: KAFKA_SSL_CAFILE
  value: /etc/clusterwarden/kafka/ca.pem
{{- end }}
{{- if eq $protocol "SSL" }}
- name: KAFKA_SSL_CERTFILE
  value: /etc/clusterwarden/kafka/client.crt
- name: KAFKA_SSL_KEYFILE
  value: /etc/clusterwarden/kafka/client.key
{{- end }}
{{- end }}
{{- end -}}

{{/* Whether a principal's pod needs the `kafka` volume: a CA to trust, or (SSL) its own
client certificate. */}}
{{- define "clusterwarden.kafkaFiles" -}}
{{- $protocol := include "clusterwarden.kafkaProtocol" . -}}
{{- if or (eq $protocol "SSL") (and (ne $protocol "PLAINTEXT") .Values.kafka.caCert) -}}true{{- end -}}
{{- end -}}

{{/* The `kafka` volume of one principal's pod, one folder: the broker's CA (a ConfigMap: it
is public) and, with SSL, the principal's own certificate and key, and no other principal's.
Same arguments as clusterwarden.kafkaEnv, plus "mode" (the files' mode). */}}
{{- define "clusterwarden.kafkaVolume" -}}
{{- $protocol := include "clusterwarden.kafkaProtocol" .root -}}
- name: kafka
  projected:
    defaultMode: {{ .mode }}
    sources:
      {{- if .root.Values.kafka.caCert }}
      - configMap:
          name: {{ include "clusterwarden.fullname" .root }}-kafka-ca
          items: [{key: ca.pem, path: ca.pem}]
      {{- end }}
      {{- if eq $protocol "SSL" }}
      - secret:
          name: {{ .secret }}
          items:
            - {key: {{ .principal }}-cert, path: client.crt}
            - {key: {{ .principal }}-key, path: client.key}
      {{- end }}
{{- end -}}

{{/* The audit chains' key, the same in every service (services/shared/audit.py). */}}
{{- define "clusterwarden.auditKeyEnv" -}}
- name: WARDEN_AUDIT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "clusterwarden.keysSecret" . }}
      key: audit-key
{{- end -}}

{{/* How each process runs, as warden/launcher.py's service_command runs it (FastStream's
runner with the service's app factory; the API under uvicorn). */}}
{{- define "clusterwarden.command" -}}
{{- if eq . "api" -}}
["python", "-m", "services.api"]
{{- else -}}
["faststream", "run", "services.{{ . }}.app:create_app", "--factory"]
{{- end -}}
{{- end -}}

{{/* The probes of every process, on its container port named .port (the API's "http", every
other service's "health"): liveness on /livez (a background loop or a consumer ended, or the
event loop is stuck: a restart helps), readiness on /readyz (start-up finished, and the broker,
Redis and the database answer as far as the process needs them; an outage of theirs takes the
pods out of service and restarts none). Call with (dict "root" $ "port" "<name>"). */}}
{{- define "clusterwarden.probes" -}}
{{- $probes := .root.Values.probes -}}
livenessProbe:
  httpGet:
    path: /livez
    port: {{ .port }}
  {{- toYaml $probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ .port }}
  {{- toYaml $probes.readiness | nindent 2 }}
{{- end -}}
