/** The data pipeline: documents from files, packing into windows, train/val split, batch loading, the default corpus. */
export { capDocs, loadDocs, reportNoAssistant, loadDocuments, parseJsonlLine, parseJsonlRecord, renderChatML, type ChatMessage, type ChatRenderer, type Doc, type LoadedDocs } from './documents.js';
export { describePacking, documentPositions, logSplitDocs, packDocuments, packForJob, packingFor, packingOfDescription, splitTrainVal, PACKINGS, type JobTokenizer, type Packing, type PackingChoice, type PackOptions, type PackedData, type TokenEncoder, type Window } from './pack.js';
export { BatchLoader, stackWindows, windowPositions, type Batch, type BatchLoaderOptions, type LoaderState } from './loader.js';
export { loadDocCorpus, type DocCorpus, type DocCorpusOptions } from './doc-corpus.js';
