// Every problem with a model directory surfaces as an ArtifactError: the CLI prints its message
// as-is, so the message must name the file (and tensor / field) a user has to look at.

export class ArtifactError extends Error {
  /** the file (or directory) the problem was found in, when there is one */
  readonly file?: string;

  constructor(message: string, file?: string) {
    super(message);
    this.name = 'ArtifactError';
    this.file = file;
  }
}
